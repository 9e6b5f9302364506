//! Who a bearer token is, and the shipped ValidatingAdmissionPolicy
//! (`deploy/components/own-node-only`) evaluated on every write of an
//! ArpGuardNode, as kube-apiserver evaluates it: its CEL expressions run by
//! a CEL interpreter (the `cel` crate, cel-go's semantics) over `request`
//! (operation, userInfo with the node-name extra of a Pod-bound token),
//! `object` and `oldObject`. A denial is a 403 with the policy's message.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use anyhow::{anyhow, Context as _, Result};
use serde_json::{json, Value};

use super::{status, FakeApi};

/// The `authentication.kubernetes.io/node-name` extra of a Pod-bound token.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// A user as the API server authenticates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub username: String,
    /// The node its token is bound to (None: no such claim, as a token from
    /// before KEP-4193 or a person's).
    pub node: Option<String>,
}

impl FakeApi {
    /// Requests with bearer `token` are `who` (for the admission policy).
    pub fn set_user(&self, token: &str, who: User) {
        (self.inner.state.lock().unwrap().identities).insert(token.to_owned(), who);
    }
}

/// The policy as shipped: its match condition and validations.
pub struct Policy {
    conditions: Vec<cel::Program>,
    validations: Vec<(cel::Program, Option<cel::Program>)>,
}

/// The shipped policy, read once.
pub fn shipped() -> Result<Arc<Policy>> {
    static P: std::sync::OnceLock<std::result::Result<Arc<Policy>, String>> =
        std::sync::OnceLock::new();
    P.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/components/own-node-only/policy.yaml");
        load(&path).map(Arc::new).map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

fn env() -> Arc<cel::Env> {
    let mut env = cel::Env::stdlib();
    // Kubernetes' CEL has cel-go's strings extension (`join`, ...).
    let _ = env.add_extension(cel::extensions::strings);
    Arc::new(env)
}

fn load(path: &Path) -> Result<Policy> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let docs: Vec<Value> = serde_saphyr::from_str_multiple::<Value, Vec<_>>(&text)
        .map_err(|e| anyhow!("the policy's YAML: {e}"))?;

    let vap = (docs.iter())
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .context("no ValidatingAdmissionPolicy")?;
    let env = env();
    let compile = |e: &Value| -> Result<cel::Program> {
        let src = e.as_str().context("an expression")?;
        env.compile(src).map_err(|e| anyhow!("{src}: {e:?}"))
    };
    let spec = &vap["spec"];
    let conditions = (spec["matchConditions"].as_array().into_iter().flatten())
        .map(|c| compile(&c["expression"]))
        .collect::<Result<_>>()?;
    let validations = (spec["validations"].as_array().into_iter().flatten())
        .map(|v| {
            let msg = (!v["messageExpression"].is_null())
                .then(|| compile(&v["messageExpression"]))
                .transpose()?;
            Ok((compile(&v["expression"])?, msg))
        })
        .collect::<Result<_>>()?;
    Ok(Policy {
        conditions,
        validations,
    })
}

impl Policy {
    /// None: admitted; Some(message): denied. `old`/`new`: the object
    /// before and after (None where the operation has none).
    pub fn check(
        &self,
        operation: &str,
        who: &User,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> Result<Option<String>> {
        let mut extra = BTreeMap::new();
        if let Some(n) = &who.node {
            extra.insert(NODE_NAME_EXTRA, vec![n.clone()]);
        }
        let request = json!({
            "operation": operation,
            "userInfo": {"username": who.username, "extra": extra},
        });
        let mut ctx = cel::Context::with_env(env());
        ctx.add_variable("request", request)?;
        ctx.add_variable("object", new.cloned().unwrap_or(Value::Null))?;
        ctx.add_variable("oldObject", old.cloned().unwrap_or(Value::Null))?;
        for c in &self.conditions {
            if c.execute(&ctx)? != cel::Value::Bool(true) {
                return Ok(None);
            }
        }
        for (v, msg) in &self.validations {
            if v.execute(&ctx)? != cel::Value::Bool(true) {
                let said = match msg.as_ref().map(|m| m.execute(&ctx)).transpose()? {
                    Some(cel::Value::String(s)) => s.to_string(),
                    _ => "denied by arp-guard-own-node-only".to_owned(),
                };
                return Ok(Some(said));
            }
        }
        Ok(None)
    }
}

/// Who `token` is (anonymous without one, as an unauthenticated server
/// sees it; a token with no identity set is a service account of no node).
pub(super) fn who(inner: &super::Inner, token: Option<&str>) -> User {
    let st = inner.state.lock().unwrap();
    match token.and_then(|t| st.identities.get(t)) {
        Some(i) => i.clone(),
        None => User {
            username: "system:anonymous".into(),
            node: None,
        },
    }
}

/// The 403 a denied write gets, as kube-apiserver words it.
pub(super) fn denied(name: &str, message: &str) -> (u16, Value) {
    let text = format!(
        "arpguardnodes.arp-guard.io \"{name}\" is forbidden: ValidatingAdmissionPolicy \
         'arp-guard-own-node-only' with binding 'arp-guard-own-node-only' denied request: {message}"
    );
    (403, status(403, "Forbidden", &text))
}
