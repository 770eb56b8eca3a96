//! Names of probe points outside the standard chains (any catalog, crate::merge::catalog),
//! interned to a u16 so a point id stays `Copy` and small. Append-only for the process's life:
//! a catalog has a few hundred names. Apart from the catalog so that the segment table can
//! print a custom point's name without depending on the catalog's placement logic.

use std::sync::{Mutex, OnceLock};

/// Interned names of custom points (append-only; a few hundred per catalog).
fn names() -> &'static Mutex<Vec<&'static str>> {
    static NAMES: OnceLock<Mutex<Vec<&'static str>>> = OnceLock::new();
    NAMES.get_or_init(|| Mutex::new(Vec::new()))
}

/// The index of a custom point name (`ROLE.NAME`); `None` past 65 536 distinct names.
pub fn intern(name: &str) -> Option<u16> {
    let mut names = names().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = names.iter().position(|n| *n == name) {
        return Some(i as u16);
    }
    let i = u16::try_from(names.len()).ok()?;
    names.push(Box::leak(name.to_owned().into_boxed_str()));
    Some(i)
}

/// The name of an interned custom point.
pub fn name(i: u16) -> &'static str {
    let names = names().lock().unwrap_or_else(|e| e.into_inner());
    names.get(usize::from(i)).copied().unwrap_or("custom.?")
}
