//! Text from outside as it is shown and logged (`guard_wire::text`: the
//! plugin clips what a guard says with the same rule).

pub use guard_wire::text::clip;
