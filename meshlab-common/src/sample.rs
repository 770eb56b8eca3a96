//! Connection sampling that both ends of a connection, on different machines, agree on.

/// FNV-1a (32-bit) over the canonical form of a 4-tuple: the two (address, port) endpoints in
/// ascending order, so the client and the server of one connection compute the same hash.
/// Addresses are 16 bytes (IPv4-mapped for IPv4), ports in host byte order.
#[cfg_attr(target_arch = "bpf", inline(never))]
pub fn conn_sample_hash(a_addr: &[u8; 16], a_port: u16, b_addr: &[u8; 16], b_port: u16) -> u32 {
    // Written with index loops and no tuple temporaries: this runs in sock_ops, whose 512-byte
    // BPF stack is shared with the connection record being built.
    let a_first = endpoint_le(a_addr, a_port, b_addr, b_port);
    let (first, first_port, second, second_port) = if a_first {
        (a_addr, a_port, b_addr, b_port)
    } else {
        (b_addr, b_port, a_addr, a_port)
    };
    let mut hash: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < 16 {
        hash = fnv_step(hash, first[i]);
        i += 1;
    }
    hash = fnv_step(fnv_step(hash, (first_port >> 8) as u8), first_port as u8);
    let mut i = 0;
    while i < 16 {
        hash = fnv_step(hash, second[i]);
        i += 1;
    }
    fnv_step(fnv_step(hash, (second_port >> 8) as u8), second_port as u8)
}

#[inline(always)]
fn fnv_step(hash: u32, byte: u8) -> u32 {
    (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
}

/// (a_addr, a_port) <= (b_addr, b_port) in lexicographic (byte) order.
#[inline(always)]
fn endpoint_le(a_addr: &[u8; 16], a_port: u16, b_addr: &[u8; 16], b_port: u16) -> bool {
    let (a, b) = (u128::from_be_bytes(*a_addr), u128::from_be_bytes(*b_addr));
    a < b || (a == b && a_port <= b_port)
}

/// Whether a connection is in the 1-in-`every` sample (`every` 0 or 1: all connections).
#[inline(always)]
pub fn conn_sampled(hash: u32, every: u32) -> bool {
    every <= 1 || hash.is_multiple_of(every)
}

/// Whether the request turn whose first byte is at ISN-relative stream offset `offset` of the
/// connection with [`conn_sample_hash`] `conn_hash` is in the 1-in-`every` message sample.
///
/// Both ends compute the same value without talking: the sender takes `write_seq - snd_base`
/// at the turn's first send, the receiver `seq - rcv_base` of the turn's first segment, and
/// those name the same byte. The murmur3 finaliser spreads consecutive offsets over the range.
#[inline(always)]
pub fn message_sampled(conn_hash: u32, offset: u32, every: u32) -> bool {
    let mut h = conn_hash ^ offset.wrapping_mul(0x9e37_79b1);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    every <= 1 || h.is_multiple_of(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_agree_and_sampling_keeps_about_one_in_n() {
        let client = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
        let server = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
        let mut kept = 0;
        for port in 30_000..40_000u16 {
            let from_client = conn_sample_hash(&client, port, &server, 8080);
            let from_server = conn_sample_hash(&server, 8080, &client, port);
            assert_eq!(from_client, from_server, "port {port}");
            kept += u32::from(conn_sampled(from_client, 10));
        }
        // 10 000 connections sampled 1/10: a fair hash keeps 1000 +- a few percent.
        assert!((900..=1100).contains(&kept), "kept {kept} of 10000");
    }

    #[test]
    fn message_sampling_keeps_about_one_in_n_of_a_connections_requests() {
        // A connection's requests at offsets 0, 37, 74, ...: a fair hash keeps ~1/10 of them,
        // and every offset is kept at 1/1.
        let hash = 0x1234_5678;
        let kept = (0..10_000u32)
            .filter(|k| message_sampled(hash, k * 37, 10))
            .count();
        assert!((900..=1100).contains(&kept), "kept {kept} of 10000");
        assert!((0..100u32).all(|k| message_sampled(hash, k, 1)));
    }
}
