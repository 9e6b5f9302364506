//! An LB IP carried by several Services: their claims folded into the IP's
//! one claim, and a split election (their records naming different nodes)
//! named and, with `--settle-shared-ips`, settled.

use std::sync::Arc;

use guard_wire::api::{SharedService, SplitElection};

use super::store::Store;
use crate::model::cluster::OwnerRecord;

impl Store {
    /// The claim of an IP from the claims of the Services that carry it
    /// (each with whether it is `externalTrafficPolicy: Local`), in the
    /// Services' order (namespace/name): Services whose owners agree give
    /// that owner; Services whose owners disagree leave it none, and when
    /// their records name two nodes or more that is a split election
    /// (each of those nodes announces the IP), settled on one of them only
    /// when `settle` says so and every Service is `Cluster` (see
    /// [`settle`]).
    pub(super) fn fold(claims: Vec<(OwnerRecord, bool)>, settle: bool) -> Option<OwnerRecord> {
        let mut it = claims.iter();
        let (first, _) = it.next()?;
        let mut out = first.clone();
        for (c, _) in it {
            out = match (out.owner == c.owner, out) {
                (true, mut prev) => {
                    prev.certain &= c.certain;
                    prev
                }
                (false, prev) => OwnerRecord {
                    owner: None,
                    why: format!(
                        "IP shared by Services whose owners disagree: {} / {}",
                        prev.why, c.why
                    )
                    .into(),
                    certain: prev.certain && c.certain,
                    service: prev.service,
                    split: None,
                },
            };
        }
        let mut holders: Vec<&Arc<str>> = claims
            .iter()
            .filter_map(|(c, _)| c.owner.as_ref())
            .collect();
        holders.sort_unstable();
        holders.dedup();
        if holders.len() >= 2 {
            let (split, kept) = Self::settle(&claims, settle);
            if let Some(node) = kept {
                out.why = format!("{}; settled on {node} (--settle-shared-ips)", out.why).into();
                out.owner = Some(node);
            }
            out.split = Some(Arc::new(split));
        }
        Some(out)
    }

    /// A split election as the operator reads it, and the node it is
    /// settled on, if any: with `settle`, when every Service is
    /// `externalTrafficPolicy: Cluster` (any node serves each of them) and
    /// every record is certain, the node named by the first Service by
    /// namespace/name that names one. Every guard computes the same
    /// without talking, and it does not change while the records do not
    /// (not the Lease acquired first: the holders' clocks write
    /// acquireTime, and MetalLB's statuses have none). Never with `Local`:
    /// the other node may hold that Service's only endpoints.
    fn settle(claims: &[(OwnerRecord, bool)], settle: bool) -> (SplitElection, Option<Arc<str>>) {
        let name =
            |c: &OwnerRecord| (c.service.as_ref()).map_or_else(String::new, ToString::to_string);
        let services = (claims.iter())
            .map(|(c, local)| SharedService {
                service: name(c),
                holder: c.owner.as_deref().map(str::to_owned),
                record: c.why.to_string(),
                local: *local,
            })
            .collect();
        let local = claims.iter().find(|(_, l)| *l);
        // The first Service (by namespace/name) whose record names a node.
        let first = (claims.iter()).find(|(c, _)| c.owner.is_some());
        let (kept, why) = if !settle {
            (None, "not settled: --settle-shared-ips is off".to_owned())
        } else if let Some((c, _)) = local {
            let svc = name(c);
            (None, format!("never settled: {svc} is externalTrafficPolicy: Local (only nodes with its endpoints serve it)"))
        } else if claims.iter().any(|(c, _)| !c.certain) {
            (
                None,
                "not settled while a record is not confirmed".to_owned(),
            )
        } else {
            let kept = first.and_then(|(c, _)| c.owner.clone());
            let svc = first.map(|(c, _)| name(c)).unwrap_or_default();
            let n = kept.as_deref().unwrap_or_default();
            (kept.clone(), format!("settled on {n}, the node {svc}'s record names ({svc} is the first of the Services by namespace/name; all are externalTrafficPolicy: Cluster)"))
        };
        let split = SplitElection {
            services,
            settled_on: kept.as_deref().map(str::to_owned),
            settle: why,
        };
        (split, kept)
    }
}
