//! Why a request to the Kubernetes API failed, in the words an operator acts
//! on: the guard's own credentials or trust (401, 403, a certificate that does
//! not verify) need a fix on this side and make the guard not ready; an API
//! that is down, slow or failing is waited out. Pure: the feed keeps the
//! causes and logs them (`problems`).

use std::error::Error as StdError;

/// The class of a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// 401: the token is missing, expired or revoked.
    Unauthorized,
    /// 403: the ServiceAccount lacks a permission (RBAC).
    Forbidden,
    /// The API server's certificate failed verification.
    Certificate,
    /// Another TLS failure (not an HTTPS port, no common protocol).
    Tls,
    /// The client cannot produce its credentials (token file, exec plugin).
    Credentials,
    /// No connection: refused, reset, unreachable.
    Unreachable,
    /// No answer in time.
    Timeout,
    /// The server answered with another error (5xx, 429, 404...).
    Server,
    /// Anything else: a watch ended at once, a stuck stream, a bad body.
    Other,
}

/// A failed request: its cause and the error as the client reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub cause: Cause,
    pub text: String,
    /// The HTTP status the API answered, if it did.
    pub code: Option<u16>,
    /// How long the server asked to be left alone (`Retry-After` of a 429
    /// or 503, carried in its Status).
    pub retry_after: Option<std::time::Duration>,
}

impl Failure {
    pub fn new(cause: Cause, text: impl Into<String>) -> Self {
        Failure {
            cause,
            text: text.into(),
            code: None,
            retry_after: None,
        }
    }

    /// `what` (say, "list") failed with `e`; the text follows the error's
    /// sources down to the root cause ("client error (Connect)" alone says
    /// nothing).
    pub fn of(what: &str, e: &kube::Error) -> Self {
        let mut text = format!("{what}: {e}");
        let mut cur = StdError::source(e);
        while let Some(err) = cur {
            let s = err.to_string();
            if !text.contains(&s) {
                text = format!("{text}: {s}");
            }
            cur = err.source();
        }
        let mut f = Failure::new(Cause::of(e), text);
        if let kube::Error::Api(s) = e {
            f.code = Some(s.code);
            f.retry_after = (s.details.as_ref())
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| std::time::Duration::from_secs(s.into()));
        }
        f
    }

    /// `what` got no answer within `d`.
    pub fn timeout(what: &str, d: std::time::Duration) -> Self {
        Failure::new(Cause::Timeout, format!("{what}: no answer within {d:?}"))
    }
}

impl Cause {
    pub fn of(e: &kube::Error) -> Cause {
        match e {
            kube::Error::Api(s) => Cause::of_code(s.code),
            kube::Error::Auth(_) => Cause::Credentials,
            e => Cause::of_chain(e),
        }
    }

    /// A failed read of a response's body (a watch cut mid-stream).
    pub fn of_io(e: &std::io::Error) -> Cause {
        Cause::of_chain(e)
    }

    /// An HTTP status code (or a Status object's) other than success.
    pub fn of_code(code: u16) -> Cause {
        match code {
            401 => Cause::Unauthorized,
            403 => Cause::Forbidden,
            _ => Cause::Server,
        }
    }

    /// Walk the error's sources: a rustls error anywhere is TLS (also one
    /// wrapped in an `io::Error`, whose `source()` skips it); else the kind
    /// of the first I/O error that says something.
    fn of_chain(e: &(dyn StdError + 'static)) -> Cause {
        let mut found = Cause::Other;
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(t) = err.downcast_ref::<rustls::Error>() {
                return match t {
                    rustls::Error::InvalidCertificate(_)
                    | rustls::Error::NoCertificatesPresented => Cause::Certificate,
                    _ => Cause::Tls,
                };
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if let Some(inner) = io.get_ref() {
                    let c = Cause::of_chain(inner);
                    if matches!(c, Cause::Certificate | Cause::Tls) {
                        return c;
                    }
                }
                use std::io::ErrorKind::*;
                let kind = match io.kind() {
                    ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected
                    | HostUnreachable | NetworkUnreachable | AddrNotAvailable | BrokenPipe => {
                        Cause::Unreachable
                    }
                    TimedOut => Cause::Timeout,
                    _ => Cause::Other,
                };
                if found == Cause::Other {
                    found = kind;
                }
            }
            cur = err.source();
        }
        found
    }

    /// The guard's own access is broken: a fix is needed on this side (the
    /// daemon is not ready meanwhile), waiting does not help.
    pub fn needs_fix(self) -> bool {
        matches!(
            self,
            Cause::Unauthorized
                | Cause::Forbidden
                | Cause::Certificate
                | Cause::Tls
                | Cause::Credentials
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Cause::Unauthorized => "unauthorized",
            Cause::Forbidden => "forbidden",
            Cause::Certificate => "certificate",
            Cause::Tls => "tls",
            Cause::Credentials => "credentials",
            Cause::Unreachable => "unreachable",
            Cause::Timeout => "timeout",
            Cause::Server => "server_error",
            Cause::Other => "other",
        }
    }

    /// What went wrong, in one phrase.
    pub fn summary(self) -> &'static str {
        match self {
            Cause::Unauthorized => "Kubernetes API token rejected (401 Unauthorized)",
            Cause::Forbidden => "Kubernetes API access forbidden (403 Forbidden)",
            Cause::Certificate => "TLS certificate verification of the Kubernetes API failed",
            Cause::Tls => "TLS handshake with the Kubernetes API failed",
            Cause::Credentials => "cannot load the Kubernetes credentials",
            Cause::Unreachable => "Kubernetes API unreachable",
            Cause::Timeout => "Kubernetes API not answering in time",
            Cause::Server => "Kubernetes API answering with errors",
            Cause::Other => "Kubernetes API feed failing",
        }
    }

    /// What to fix (causes that need no fix on this side: empty).
    pub fn fix(self) -> &'static str {
        match self {
            Cause::Unauthorized => {
                "the service-account token is missing, expired or revoked: check the guard's \
                 ServiceAccount and its token (in-cluster: /var/run/secrets/kubernetes.io/serviceaccount/token, \
                 re-read about once a minute) or the kubeconfig's user"
            }
            Cause::Forbidden => {
                "the guard's ServiceAccount lacks permissions: bind it to a ClusterRole that may get, list \
                 and watch services, leases (coordination.k8s.io) and servicel2statuses (metallb.io), as \
                 the RBAC manifest in deploy/ does"
            }
            Cause::Certificate => {
                "the API server's certificate is not trusted: the CA bundle (in-cluster: \
                 /var/run/secrets/kubernetes.io/serviceaccount/ca.crt, else the kubeconfig's \
                 certificate-authority) must hold the CA that signed it, and the certificate must name \
                 the address the guard connects to (KUBERNETES_SERVICE_HOST or the kubeconfig's server)"
            }
            Cause::Tls => "check that the API address (KUBERNETES_SERVICE_HOST/PORT or the kubeconfig's server) is the API server's HTTPS endpoint",
            Cause::Credentials => "check the kubeconfig's user (token file, exec plugin)",
            _ => "",
        }
    }
}

/// Who failed: a stream, the API check, or the confirming GETs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Who {
    Stream(super::per_stream::StreamId),
    ApiCheck,
    Confirm,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(reason, reason)
                .with_code(code)
                .boxed(),
        )
    }

    /// An error that wraps another, as hyper's and tower's do.
    #[derive(Debug)]
    struct Wrap(Box<dyn StdError + Send + Sync>);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error (Connect)")
        }
    }
    impl StdError for Wrap {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    fn service(e: impl StdError + Send + Sync + 'static) -> kube::Error {
        kube::Error::Service(Box::new(Wrap(Box::new(e))))
    }

    #[test]
    fn http_statuses() {
        assert_eq!(Cause::of(&api(401, "Unauthorized")), Cause::Unauthorized);
        assert_eq!(Cause::of(&api(403, "Forbidden")), Cause::Forbidden);
        assert_eq!(Cause::of(&api(500, "InternalError")), Cause::Server);
        assert_eq!(Cause::of(&api(404, "NotFound")), Cause::Server);
        assert_eq!(Cause::of_code(401), Cause::Unauthorized);
    }

    /// tokio-rustls hands the handshake's error up as an `io::Error` that
    /// holds the rustls error; hyper and kube wrap that again.
    #[test]
    fn certificate_errors_inside_io_errors() {
        use rustls::CertificateError::*;
        for ce in [UnknownIssuer, NotValidForName, Expired] {
            let io = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(ce),
            );
            assert_eq!(Cause::of(&service(io)), Cause::Certificate);
        }
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        );
        assert_eq!(Cause::of(&service(io)), Cause::Tls);
    }

    #[test]
    fn connection_errors() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(Cause::of(&service(refused)), Cause::Unreachable);
        let slow = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(Cause::of(&service(slow)), Cause::Timeout);
        let odd = std::io::Error::other("something else");
        assert_eq!(Cause::of(&service(odd)), Cause::Other);
        assert_eq!(
            Cause::of(&kube::Error::LinesCodecMaxLineLengthExceeded),
            Cause::Other
        );
    }

    #[test]
    fn only_the_guards_own_access_needs_a_fix() {
        use Cause::*;
        for c in [Unauthorized, Forbidden, Certificate, Tls, Credentials] {
            assert!(c.needs_fix() && !c.fix().is_empty(), "{c:?}");
        }
        for c in [Unreachable, Timeout, Server, Other] {
            assert!(!c.needs_fix() && c.fix().is_empty(), "{c:?}");
        }
        assert!(Unauthorized.summary().contains("401"));
        assert!(Forbidden.summary().contains("403"));
        assert!(Certificate.summary().contains("certificate verification"));
    }

    #[test]
    fn failures_carry_their_cause() {
        let f = Failure::of("list", &api(403, "Forbidden"));
        assert_eq!(f.cause, Cause::Forbidden);
        assert!(f.text.starts_with("list: "), "{}", f.text);
        // The root cause is in the text, not only the outermost wrapper's words.
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let f = Failure::of("watch", &service(io));
        assert_eq!(
            f.text,
            "watch: ServiceError: client error (Connect): invalid peer certificate: UnknownIssuer"
        );
        let t = Failure::timeout("watch", std::time::Duration::from_secs(2));
        assert_eq!(t.cause, Cause::Timeout);
    }
}
