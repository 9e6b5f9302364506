use super::*;
use crate::model::{clients::Entry, takeover::TakeoverRecord};

const S: u64 = 1_000_000_000;
/// 2026-12-04 12:00:00 UTC, in Unix ns.
const NOON: u64 = 1_796_385_600 * S;
const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 102));
const IP2: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 101));

/// The writer's clock: booted at NOON - 1000 s.
fn clock() -> Clock {
    Clock {
        boot: "b1".into(),
        mono_ns: 1000 * S,
        unix_ns: NOON,
    }
}

/// The reader's clock `later_s` after the writer's pair, in the same boot
/// or in another one (booted 10 s before it reads).
fn reader(later_s: u64, same_boot: bool) -> Clock {
    if same_boot {
        Clock {
            boot: "b1".into(),
            mono_ns: (1000 + later_s) * S,
            unix_ns: NOON + later_s * S,
        }
    } else {
        Clock {
            boot: "b2".into(),
            mono_ns: 10 * S,
            unix_ns: NOON + later_s * S,
        }
    }
}

fn client(mac: u8, last_s: u64) -> Kept {
    Kept {
        entry: Entry {
            ip: IP,
            mac: [2, 0, 0, 0, 0, mac],
            client_ip: "198.51.100.31".parse().unwrap(),
            first_ns: 900 * S,
            last_ns: last_s * S,
            packets: 40,
            ifindex: 2,
            vlan: 100,
        },
        baseline: 5,
        run: 900 * S,
        observed: true,
        stale_reported: true,
        announced: false,
    }
}

/// This node lost IP at 950 s (with a client sending since), and took
/// IP2 over at 990 s (announced after 12 ms), on the writer's clock.
fn known() -> Known {
    let lost = IpKnown {
        state: Ownership::Foreign,
        source: "ownership file: node-b".into(),
        since_unix: NOON / S - 50,
        lost_ns: Some(950 * S),
        takeover: None,
        packets: 52,
        claims: Vec::new(),
    };
    let taken = IpKnown {
        state: Ownership::Owned,
        source: "ownership file: node-a".into(),
        since_unix: NOON / S - 10,
        lost_ns: None,
        takeover: Some(KeptTakeover {
            record: TakeoverRecord {
                at_unix: NOON / S - 10,
                first_announcement_ms: Some(12),
                via: Some(Origin::Guard),
                silent: false,
            },
            pending: None,
        }),
        packets: 0,
        claims: Vec::new(),
    };
    Known {
        ips: BTreeMap::from([(IP, lost), (IP2, taken)]),
        clients: vec![client(0xa, 999)],
    }
}

fn bytes(k: &Known) -> Vec<u8> {
    encode(&history(k, "node-a", &clock(), NOON))
}

/// The stored form, byte for byte: a change of the format is a change of
/// VERSION.
const FIXTURE: &str = r#"{"node":"node-a","saved_at":1796385600000000000,"clock":{"boot":"b1","mono_ns":1000000000000,"unix_ns":1796385600000000000},"ips":[{"ip":"198.51.100.101","state":"owned","source":"ownership file: node-a","since":1796385590,"takeover":{"at_unix":1796385590,"first_ms":12,"via":"guard","silent":false}},{"ip":"198.51.100.102","state":"foreign","source":"ownership file: node-b","since":1796385550,"lost_at":1796385550000000000,"packets":52}],"clients":[{"ip":"198.51.100.102","mac":[2,0,0,0,0,10],"client_ip":"198.51.100.31","first_at":1796385500000000000,"last_at":1796385599000000000,"packets":40,"baseline":5,"ifindex":2,"vlan":100,"run_at":1796385500000000000,"flags":3}]}"#;

fn fixture() -> Vec<u8> {
    let mut out = header(FIXTURE.as_bytes()).into_bytes();
    out.extend_from_slice(FIXTURE.as_bytes());
    out
}

#[test]
fn the_stored_form_is_the_fixture() {
    let b = bytes(&known());
    assert_eq!(
        String::from_utf8_lossy(&b),
        String::from_utf8_lossy(&fixture())
    );
    assert!(b.starts_with(b"arp-guard-history 1 "));
}

/// Read back in the same boot: exactly what was written (times to the
/// millisecond); in another boot, the same instants on the new clock.
#[test]
fn a_history_reads_back_in_this_boot_and_the_next() {
    let (k, dropped) = decode(&fixture(), "node-a", &reader(30, true), None).unwrap();
    assert_eq!((k, dropped), (known(), 0));
    // Another boot, 30 s after the writer's pair: its monotonic clock is at
    // 10 s then, so the loss (50 s before the pair) predates it.
    let (k, _) = decode(&fixture(), "node-a", &reader(30, false), None).unwrap();
    assert_eq!(k.ips[&IP].lost_ns, Some(1), "before this boot: its start");
    let c = &k.clients[0];
    assert_eq!(c.entry.last_ns, 1, "before this boot too");
    assert_eq!(k.ips[&IP2].takeover, known().ips[&IP2].takeover);
    // 30 s after the pair, in a boot whose clock reads 1000 s then.
    let mut later = reader(30, false);
    later.mono_ns = 1000 * S;
    let (k, _) = decode(&fixture(), "node-a", &later, None).unwrap();
    assert_eq!(k.ips[&IP].lost_ns, Some(1000 * S - 80 * S));
    assert_eq!(k.clients[0].entry.last_ns, 1000 * S - 31 * S);
}

/// Times come back to the nanosecond (failover times computed from them
/// are the same after a restart), a pending takeover's start with them.
#[test]
fn monotonic_times_round_trip() {
    let c = clock();
    for t in [1, 999 * S + 123_456, 1000 * S, 1_000_000 * S + 7] {
        assert_eq!(c.mono_ns_of(c.unix_ns_of(t)), t);
    }
    let mut k = known();
    let t = k.ips.get_mut(&IP2).unwrap().takeover.as_mut().unwrap();
    (t.pending, t.record.silent) = (Some((995 * S, true)), true);
    let b = encode(&history(&k, "node-a", &clock(), NOON));
    let (back, _) = decode(&b, "node-a", &reader(1, true), None).unwrap();
    assert_eq!(
        back.ips[&IP2].takeover.as_ref().unwrap().pending,
        Some((995 * S, true))
    );
}

#[test]
fn another_version_another_node_and_garbage_are_rejected_whole() {
    let other = String::from_utf8(fixture())
        .unwrap()
        .replacen(" 1 ", " 2 ", 1);
    let now = reader(1, true);
    assert_eq!(
        decode(other.as_bytes(), "node-a", &now, None),
        Err(Rejected::Version("2".into()))
    );
    let r = decode(b"arp-guard-history v0.9\n{}", "node-a", &now, None).unwrap_err();
    assert_eq!(
        r.to_string(),
        "format version v0.9; this arp-guard reads version 1"
    );
    assert_eq!(
        decode(&fixture(), "node-b", &now, None),
        Err(Rejected::OtherNode("node-a".into()))
    );
    assert_eq!(decode(b"", "node-a", &now, None), Err(Rejected::Empty));
    assert_eq!(
        decode(&[0; 8192], "node-a", &now, None),
        Err(Rejected::Empty)
    );
    assert_eq!(
        decode(b"{\"node\":\"node-a\"}", "node-a", &now, None),
        Err(Rejected::NotHistory)
    );
    assert_eq!(
        decode(&[0xff; 300], "node-a", &now, None),
        Err(Rejected::NotHistory)
    );
    let r = decode(b"arp-guard-history 1 12\n{}", "node-a", &now, None).unwrap_err();
    assert!(matches!(r, Rejected::Corrupt(_)), "{r}");
}

#[test]
fn a_torn_or_altered_history_is_corrupt() {
    let now = reader(1, true);
    let good = fixture();
    // Truncated anywhere in the body.
    for cut in [good.len() - 1, good.len() / 2, 80] {
        let r = decode(&good[..cut], "node-a", &now, None).unwrap_err();
        assert!(matches!(r, Rejected::Corrupt(_)), "{cut}: {r}");
    }
    assert!(decode(&good[..20], "node-a", &now, None).is_err());
    // One byte changed: the hash says so.
    let mut bad = good.clone();
    let at = bad.len() - 10;
    bad[at] ^= 0x01;
    let r = decode(&bad, "node-a", &now, None).unwrap_err();
    assert_eq!(
        r.to_string(),
        "corrupt: its content does not match its checksum"
    );
    // Zero padding (a store's pages) is fine; anything else after is not.
    let mut padded = good.clone();
    padded.extend_from_slice(&[0; 4000]);
    assert!(decode(&padded, "node-a", &now, None).is_ok());
    padded.push(b'x');
    assert!(decode(&padded, "node-a", &now, None).is_err());
    // JSON that parses, with the right hash, but is not a history.
    let body = br#"{"node":"node-a","ips":"many"}"#;
    let mut odd = header(body).into_bytes();
    odd.extend_from_slice(body);
    let r = decode(&odd, "node-a", &now, None).unwrap_err();
    assert!(r.to_string().starts_with("corrupt: "), "{r}");
}

/// A hostile history: huge, deeply nested, or claiming a huge length, is
/// rejected unread or within serde's limits; one over the entry bounds too.
#[test]
fn a_hostile_history_costs_a_bounded_read() {
    let now = reader(1, true);
    let huge = vec![b' '; MAX_STORED + 1];
    assert_eq!(
        decode(&huge, "node-a", &now, None),
        Err(Rejected::TooLarge(MAX_STORED + 1))
    );
    let r = decode(b"arp-guard-history 1 99999999999 0\n", "node-a", &now, None).unwrap_err();
    assert_eq!(r, Rejected::TooLarge(99_999_999_999));
    let deep = "[".repeat(100_000);
    let mut nested = header(deep.as_bytes()).into_bytes();
    nested.extend_from_slice(deep.as_bytes());
    let t = std::time::Instant::now();
    assert!(matches!(
        decode(&nested, "node-a", &now, None),
        Err(Rejected::Corrupt(_))
    ));
    assert!(t.elapsed() < Duration::from_secs(1));
    // More clients than any writer writes.
    let mut h = history(&known(), "node-a", &clock(), NOON);
    h.clients = vec![h.clients[0].clone(); MAX_CLIENTS + 1];
    let body = serde_json::to_vec(&h).unwrap();
    let mut over = header(&body).into_bytes();
    over.extend_from_slice(&body);
    assert!(matches!(
        decode(&over, "node-a", &now, None),
        Err(Rejected::Corrupt(_))
    ));
}

/// What is older than the window when read is dropped (each entry on its
/// own, or the whole history when it was written that long ago), and so
/// is what lies in the future.
#[test]
fn old_entries_are_dropped_when_read() {
    let mut k = known();
    // A client last seen 25 h before the pair, and a loss 25 h before it.
    let mut old = client(0xb, 1000);
    old.entry.last_ns = 1;
    old.entry.first_ns = 1;
    k.clients.push(old);
    let mut clock = clock();
    clock.mono_ns = 25 * 3600 * S;
    k.clients[0].entry.last_ns = clock.mono_ns - S;
    let b = encode(&history(&k, "node-a", &clock, NOON));
    let (back, dropped) = decode(
        &b,
        "node-a",
        &Clock {
            mono_ns: clock.mono_ns + S,
            ..clock.clone()
        },
        None,
    )
    .unwrap();
    assert_eq!(back.clients.len(), 1);
    assert_eq!(dropped, 2, "the old client, and IP's loss");
    assert_eq!(back.ips[&IP].lost_ns, None);
    assert_eq!(back.ips[&IP].packets, 52, "the counts stay with the IP");
    assert_eq!(back.ips[&IP2], known().ips[&IP2], "a takeover 10 s ago");
    // An IP with nothing recent left is not taken at all.
    let mut k = known();
    k.ips.get_mut(&IP).unwrap().packets = 0;
    let b = encode(&history(&k, "node-a", &clock, NOON));
    let (back, _) = decode(&b, "node-a", &clock, None).unwrap();
    assert!(!back.ips.contains_key(&IP));
    // Written 25 h ago: nothing is taken.
    let r = decode(&fixture(), "node-a", &reader(25 * 3600, false), None).unwrap_err();
    assert_eq!(r, Rejected::Stale { age_s: 25 * 3600 });
    // Written in the future (the reader's clock is behind by 5 minutes).
    let mut behind = reader(0, false);
    behind.unix_ns -= 300 * S;
    assert_eq!(
        decode(&fixture(), "node-a", &behind, None),
        Err(Rejected::Future)
    );
}

/// Bounds: the most recent IPs and clients are kept, the oldest dropped,
/// and the bytes stay within MAX_BYTES whatever the entries.
#[test]
fn a_history_is_bounded_oldest_first() {
    let mut k = Known::default();
    for i in 0..(MAX_CLIENTS as u64 + 100) {
        let mut c = client(0, 900 + i);
        c.entry.mac = [2, 0, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8];
        k.clients.push(c);
    }
    for i in 0..(MAX_IPS as u32 + 10) {
        let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        let mut r = known().ips[&IP].clone();
        r.lost_ns = Some(u64::from(i + 1) * S);
        k.ips.insert(ip, r);
    }
    let h = history(&k, "node-a", &clock(), NOON);
    assert_eq!((h.clients.len(), h.ips.len()), (MAX_CLIENTS, MAX_IPS));
    assert_eq!(
        h.clients[0].last_at,
        clock().unix_ns_of((900 + MAX_CLIENTS as u64 + 99) * S)
    );
    assert!(
        h.clients
            .iter()
            .all(|c| c.last_at >= clock().unix_ns_of(1000 * S)),
        "the oldest went"
    );
    assert!(h
        .ips
        .iter()
        .all(|r| r.lost_at >= Some(clock().unix_ns_of(11 * S))));
    let b = encode(&h);
    eprintln!(
        "{} clients and {} IPs: {} bytes",
        h.clients.len(),
        h.ips.len(),
        b.len()
    );
    assert!(b.len() <= MAX_BYTES + MAX_HEADER);
    // Sources too long to be a source are cut, and entries big enough to
    // pass the byte bound lose their oldest.
    for r in k.ips.values_mut() {
        r.source = "x".repeat(10_000);
    }
    let h = history(&k, "node-a", &clock(), NOON);
    assert!(h.ips.iter().all(|r| r.source.len() == MAX_SOURCE));
    let b = encode(&h);
    assert!(b.len() <= MAX_BYTES + MAX_HEADER, "{}", b.len());
    let t = std::time::Instant::now();
    let (back, _) = decode(&b, "node-a", &reader(1, true), None).unwrap();
    eprintln!(
        "read back {} IPs, {} clients in {:?}",
        back.ips.len(),
        back.clients.len(),
        t.elapsed()
    );
    assert!(
        back.clients.len() < MAX_CLIENTS,
        "the oldest clients went first"
    );
}

/// A history written long before the previous daemon's last heartbeat was
/// not kept by it (a downgrade ran in between, which keeps none): what it
/// says may have changed since, and it is not taken. One written within the
/// rewrite period of the last heartbeat is.
#[test]
fn a_history_older_than_the_last_daemon_is_not_taken() {
    let now = reader(300, true);
    let alive = |s: u64| Some((1000 + s) * S);
    assert!(decode(&fixture(), "node-a", &now, alive(299)).is_err());
    let r = decode(&fixture(), "node-a", &now, alive(299)).unwrap_err();
    assert_eq!(r, Rejected::Outdated { before_s: 299 });
    assert!(r.to_string().contains("ran since"), "{r}");
    assert!(decode(&fixture(), "node-a", &now, alive(70)).is_ok());
    assert!(decode(&fixture(), "node-a", &now, alive(0)).is_ok());
    assert!(decode(&fixture(), "node-a", &now, None).is_ok());
}

/// The census's latest claims of an IP are kept, at most MAX_CLAIMS of them.
#[test]
fn the_latest_claims_are_kept() {
    let mut k = known();
    let claim = |mac: u8, last: u64| crate::model::census::CensusEntry {
        ip: IP,
        mac: [2, 0, 0, 0, 0, mac],
        first_ns: 960 * S,
        last_ns: last * S,
        count: 3,
        ifindex: 2,
        kinds: 2,
    };
    let claims: Vec<_> = (0..6).map(|i| claim(i, 990 + u64::from(i))).collect();
    k.ips.get_mut(&IP).unwrap().claims = claims.clone();
    let h = history(&k, "node-a", &clock(), NOON);
    let (back, _) = decode(&encode(&h), "node-a", &reader(1, true), None).unwrap();
    let mut latest = claims[2..].to_vec();
    latest.reverse();
    assert_eq!(back.ips[&IP].claims, latest);
    let mut over = h.clone();
    over.ips[1].claims = vec![over.ips[1].claims[0].clone(); MAX_CLAIMS + 1];
    let body = serde_json::to_vec(&over).unwrap();
    let mut bytes = header(&body).into_bytes();
    bytes.extend_from_slice(&body);
    assert!(matches!(
        decode(&bytes, "node-a", &reader(1, true), None),
        Err(Rejected::Corrupt(_))
    ));
}
