//! The frames the guard sends of its own, each on a thread of its own and
//! never in the way of guarding: the active census's requests (`probing`)
//! and, opt-in, the unicast replies that teach a stale client the owner's
//! MAC (`refresh`, called by the clients' reader through
//! `telemetry::clients::Heal`). Both publish their documents to telemetry;
//! the daemon starts them.

pub mod probing;
pub mod refresh;
