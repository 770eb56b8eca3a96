//! Per-node connection facts from `sock_established`: cookie -> 4-tuple and side, the
//! resolution of a probe's connection reference, and the cross-node link of a request.

use super::HashMap;

use crate::schema::ConnRef;

use super::event::{Endpoint, Established};
use super::half::LinkKey;

/// Per-node connection facts from `sock_established`.
#[derive(Default)]
pub struct Conns {
    pub by_cookie: HashMap<u64, Established>,
    by_tuple: HashMap<(Endpoint, Endpoint), u64>,
}

impl Conns {
    pub fn insert(&mut self, cookie: u64, est: Established) {
        self.by_tuple
            .insert((est.local.clone(), est.remote.clone()), cookie);
        self.by_cookie.insert(cookie, est);
    }

    pub fn resolve(&self, conn: &ConnRef) -> Option<u64> {
        conn.cookie.or_else(|| {
            let local = Endpoint::new(conn.laddr.clone()?, conn.lport?);
            let remote = Endpoint::new(conn.raddr.clone()?, conn.rport?);
            self.by_tuple.get(&(local, remote)).copied()
        })
    }

    /// The cross-node link of a request starting at `request_start` on `cookie`.
    pub fn link(&self, cookie: u64, request_start: u64) -> Option<LinkKey> {
        let est = self.by_cookie.get(&cookie)?;
        let (client, server) = if est.active {
            (est.local.clone(), est.remote.clone())
        } else {
            (est.remote.clone(), est.local.clone())
        };
        Some(LinkKey {
            client,
            server,
            request_start,
        })
    }
}
