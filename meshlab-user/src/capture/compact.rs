//! The event records of capture format version 2 (docs/capture-format.md): an event is stored
//! as the 4-byte words in which it differs from the previous event of its context (its hook),
//! after a 7-byte header naming the context and which words follow. Events of one hook repeat
//! most of their words (pid, tid, cookie, addresses, ports, cpu, ...), so a recording of RPC
//! traffic takes some 18 bytes per event instead of 144 (docs/capture-format.md): the
//! recorder's CPU per event was mostly the kernel's cost of writing bytes into the page cache. Encoder and decoder keep the same
//! state, the previous event of each context, from an all-zero start at the file's beginning;
//! every record depends only on the records before it, so a capture cut short stays valid up
//! to its last complete record.

use super::EVENT_SIZE;

/// Words (u32) in an event.
pub const EVENT_WORDS: usize = EVENT_SIZE / 4;
/// kind (u8), context (u8), changed-word mask (40 bits, little-endian).
pub const EVENT_HEADER_LEN: usize = 7;
/// The longest event record: every word changed.
pub const EVENT_RECORD_MAX: usize = EVENT_HEADER_LEN + EVENT_SIZE;
/// Room the encoder needs to encode one event in place: the longest record plus the 8 bytes a
/// 16-byte store of the last word group may write beyond it (bytes that the next record
/// overwrites and that are never written out).
pub const EVENT_SLOT: usize = EVENT_RECORD_MAX + 8;
/// Number of contexts: hook ids 0-254 are their own context, every larger id shares 255.
pub const CONTEXTS: usize = 256;
/// Mask bits that may be set: one per event word.
pub const MASK_BITS: u64 = (1 << EVENT_WORDS) - 1;

const _: () = assert!(EVENT_SIZE.is_multiple_of(4) && EVENT_WORDS <= 40);

/// Index of the word holding the hook id (its low 16 bits, little-endian).
const HOOK_WORD: usize = std::mem::offset_of!(meshlab_common::Event, hook) / 4;
const _: () = assert!(std::mem::offset_of!(meshlab_common::Event, hook).is_multiple_of(4));

/// Which encoder runs: the widest this CPU has (all write the same bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    /// [`encode_words`], any CPU.
    None,
    /// x86_64 with SSSE3 and POPCNT: four words per step.
    Ssse3,
    /// x86_64 with AVX-512F and AVX-512VL: eight words per step (256-bit registers only, which
    /// do not lower the clock as 512-bit ones may on older Xeons).
    Avx512,
}

impl Simd {
    pub fn detect() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            if x86::avx512_available() {
                return Simd::Avx512;
            }
            if x86::ssse3_available() {
                return Simd::Ssse3;
            }
        }
        Simd::None
    }

    /// True when this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Simd::None => true,
            #[cfg(target_arch = "x86_64")]
            Simd::Ssse3 => x86::ssse3_available(),
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => x86::avx512_available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The previous event of every context, as words.
pub struct Contexts {
    prev: Box<[[u32; EVENT_WORDS]; CONTEXTS]>,
    /// Chosen once, not per event.
    simd: Simd,
}

impl Default for Contexts {
    fn default() -> Self {
        Contexts::with_simd(Simd::detect())
    }
}

fn word(bytes: &[u8; EVENT_SIZE], i: usize) -> u32 {
    u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

impl Contexts {
    /// Contexts that encode with `simd`, which must be [`Simd::available`] (else the scalar
    /// encoder runs).
    pub fn with_simd(simd: Simd) -> Contexts {
        Contexts {
            prev: Box::new([[0; EVENT_WORDS]; CONTEXTS]),
            simd: if simd.available() { simd } else { Simd::None },
        }
    }

    /// Encodes `event` as a record (kind byte `kind`) into `out`; returns its length.
    #[inline]
    pub fn encode(
        &mut self,
        kind: u8,
        event: &[u8; EVENT_SIZE],
        out: &mut [u8; EVENT_SLOT],
    ) -> usize {
        let context = (word(event, HOOK_WORD) & 0xffff).min(CONTEXTS as u32 - 1) as usize;
        let prev = &mut self.prev[context];
        let (mask, n) = match self.simd {
            // SAFETY: `simd` is only ever a level the CPU has (with_simd).
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { x86::encode_words_avx512(event, prev, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Simd::Ssse3 => unsafe { x86::encode_words(event, prev, out) },
            _ => encode_words(event, prev, out),
        };
        out[0] = kind;
        out[1] = context as u8;
        out[2..EVENT_HEADER_LEN].copy_from_slice(&mask.to_le_bytes()[..EVENT_HEADER_LEN - 2]);
        n
    }

    /// Applies a record's changed words (`words`: 4 bytes per bit of `mask`, in word order)
    /// to `context`'s previous event, and writes the event that results into `event`.
    pub fn decode(&mut self, context: u8, mask: u64, words: &[u8], event: &mut [u8; EVENT_SIZE]) {
        debug_assert_eq!(words.len(), 4 * mask.count_ones() as usize);
        let prev = &mut self.prev[usize::from(context)];
        let mut rest = mask;
        let mut at = 0;
        while rest != 0 {
            let i = rest.trailing_zeros() as usize;
            prev[i] = u32::from_le_bytes(words[at..at + 4].try_into().expect("4 bytes"));
            at += 4;
            rest &= rest - 1;
        }
        for (chunk, w) in event.chunks_exact_mut(4).zip(prev.iter()) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// Writes the words of `event` that differ from `prev` to `out` from [`EVENT_HEADER_LEN`] on
/// and makes `prev` the event; returns the changed-word mask and the record's length.
///
/// Branch-free over the words: each word is stored at the write position, which only moves
/// on when the word changed (a branch per word would be mispredicted all the time).
fn encode_words(
    event: &[u8; EVENT_SIZE],
    prev: &mut [u32; EVENT_WORDS],
    out: &mut [u8; EVENT_SLOT],
) -> (u64, usize) {
    let mut mask = 0u64;
    let mut n = EVENT_HEADER_LEN;
    for (i, p) in prev.iter_mut().enumerate() {
        let w = word(event, i);
        // n <= EVENT_HEADER_LEN + 4 * i, so this is in bounds for every i < EVENT_WORDS.
        out[n..n + 4].copy_from_slice(&w.to_le_bytes());
        let changed = usize::from(w != *p);
        mask |= (changed as u64) << i;
        n += 4 * changed;
        *p = w;
    }
    (mask, n)
}

/// [`encode_words`] with SIMD: compare a group of words at once, move the changed ones to
/// the group's front (an SSSE3 byte shuffle from a table, or AVX-512's compress), store the
/// group whole. `examples/capture_rewrite.rs` under callgrind counts each encoder's
/// instructions per event.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_castsi128_ps, _mm_cmpeq_epi32, _mm_loadl_epi64, _mm_loadu_si128,
        _mm_movemask_ps, _mm_shuffle_epi8, _mm_storel_epi64, _mm_storeu_si128,
        _mm256_castsi256_si128, _mm256_cmpneq_epi32_mask, _mm256_loadu_si256,
        _mm256_mask_storeu_epi32, _mm256_maskz_compress_epi32, _mm256_maskz_loadu_epi32,
        _mm256_storeu_si256,
    };

    use super::{EVENT_HEADER_LEN, EVENT_SIZE, EVENT_SLOT, EVENT_WORDS};

    /// Full 4-word groups; the last two words are a group of their own.
    const GROUPS: usize = EVENT_WORDS / 4;
    const _: () = assert!(EVENT_WORDS % 4 == 2);
    /// Full 8-word groups of the AVX-512 encoder; the last two words again on their own.
    const WIDE_GROUPS: usize = EVENT_WORDS / 8;
    const _: () = assert!(EVENT_WORDS % 8 == 2);

    pub fn ssse3_available() -> bool {
        is_x86_feature_detected!("ssse3") && is_x86_feature_detected!("popcnt")
    }

    pub fn avx512_available() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("popcnt")
    }

    /// # Safety
    /// The CPU must have AVX-512F, AVX-512VL and POPCNT ([`avx512_available`]).
    #[target_feature(enable = "avx512f,avx512vl,popcnt")]
    pub unsafe fn encode_words_avx512(
        event: &[u8; EVENT_SIZE],
        prev: &mut [u32; EVENT_WORDS],
        out: &mut [u8; EVENT_SLOT],
    ) -> (u64, usize) {
        let ev = event.as_ptr();
        let pv = prev.as_mut_ptr().cast::<u8>();
        let o = out.as_mut_ptr();
        let mut mask = 0u64;
        let mut n = EVENT_HEADER_LEN;
        // SAFETY: group g covers bytes 32g..32g+32 of event and prev (136 bytes each) for
        // g < WIDE_GROUPS, the masked loads and store of the last group bytes 128..136 only.
        // Before group g's 32-byte store n <= EVENT_HEADER_LEN + 32g, at most 7 + 96 = 103,
        // so those stores end by byte 135; the last group's 8-byte store starts at most at
        // 7 + 128 = 135 and ends by 143 < EVENT_SLOT. All unaligned.
        unsafe {
            for g in 0..WIDE_GROUPS {
                let v = _mm256_loadu_si256(ev.add(32 * g).cast::<__m256i>());
                let p = _mm256_loadu_si256(pv.add(32 * g).cast::<__m256i>());
                _mm256_storeu_si256(pv.add(32 * g).cast::<__m256i>(), v);
                let changed = _mm256_cmpneq_epi32_mask(v, p);
                let packed = _mm256_maskz_compress_epi32(changed, v);
                _mm256_storeu_si256(o.add(n).cast::<__m256i>(), packed);
                n += 4 * changed.count_ones() as usize;
                mask |= u64::from(changed) << (8 * g);
            }
            let tail = 0b11;
            let v = _mm256_maskz_loadu_epi32(tail, ev.add(32 * WIDE_GROUPS).cast::<i32>());
            let p = _mm256_maskz_loadu_epi32(tail, pv.add(32 * WIDE_GROUPS).cast::<i32>());
            _mm256_mask_storeu_epi32(pv.add(32 * WIDE_GROUPS).cast::<i32>(), tail, v);
            let changed = _mm256_cmpneq_epi32_mask(v, p);
            let packed = _mm256_castsi256_si128(_mm256_maskz_compress_epi32(changed, v));
            _mm_storel_epi64(o.add(n).cast::<__m128i>(), packed);
            n += 4 * changed.count_ones() as usize;
            mask |= u64::from(changed) << (8 * WIDE_GROUPS);
        }
        (mask, n)
    }

    /// For each 4-bit mask of changed lanes: the shuffle that packs those lanes to the front
    /// (0x80: a zero byte, never kept).
    #[repr(align(16))]
    struct PackTable([[u8; 16]; 16]);

    static PACK: PackTable = PackTable(pack_table());

    const fn pack_table() -> [[u8; 16]; 16] {
        let mut table = [[0x80u8; 16]; 16];
        let mut mask = 0;
        while mask < 16 {
            let (mut lane, mut to) = (0, 0);
            while lane < 4 {
                if mask & (1 << lane) != 0 {
                    let mut b = 0;
                    while b < 4 {
                        table[mask][4 * to + b] = (4 * lane + b) as u8;
                        b += 1;
                    }
                    to += 1;
                }
                lane += 1;
            }
            mask += 1;
        }
        table
    }

    /// Packs the changed lanes of `v` (against `p`) to the front of a 16-byte store at `out`;
    /// returns the 4-bit changed mask.
    ///
    /// # Safety
    /// SSSE3 and POPCNT ([`ssse3_available`]); `out` valid for a 16-byte unaligned store.
    #[target_feature(enable = "ssse3,popcnt")]
    #[inline]
    unsafe fn group(v: __m128i, p: __m128i, out: *mut u8) -> u32 {
        let equal = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(v, p))) as usize;
        let changed = !equal & 0xf;
        // SAFETY: PACK rows are 16 bytes; out is valid for 16 bytes (the caller's promise).
        unsafe {
            let shuffle = _mm_loadu_si128(PACK.0[changed].as_ptr().cast::<__m128i>());
            _mm_storeu_si128(out.cast::<__m128i>(), _mm_shuffle_epi8(v, shuffle));
        }
        changed as u32
    }

    /// # Safety
    /// The CPU must have SSSE3 and POPCNT ([`ssse3_available`]).
    #[target_feature(enable = "ssse3,popcnt")]
    pub unsafe fn encode_words(
        event: &[u8; EVENT_SIZE],
        prev: &mut [u32; EVENT_WORDS],
        out: &mut [u8; EVENT_SLOT],
    ) -> (u64, usize) {
        let ev = event.as_ptr();
        let pv = prev.as_mut_ptr().cast::<u8>();
        let o = out.as_mut_ptr();
        let mut mask = 0u64;
        let mut n = EVENT_HEADER_LEN;
        // SAFETY: group g covers bytes 16g..16g+16 of event and prev (136 bytes each) for
        // g < GROUPS, bytes 128..136 for the last group (8-byte loads and store). Before
        // group g's 16-byte store n <= EVENT_HEADER_LEN + 16g, at most 7 + 128 = 135 for the
        // last, so the stores end by byte 151 = EVENT_SLOT of out. All unaligned.
        unsafe {
            for g in 0..GROUPS {
                let v = _mm_loadu_si128(ev.add(16 * g).cast::<__m128i>());
                let p = _mm_loadu_si128(pv.add(16 * g).cast::<__m128i>());
                _mm_storeu_si128(pv.add(16 * g).cast::<__m128i>(), v);
                let changed = group(v, p, o.add(n));
                n += 4 * changed.count_ones() as usize;
                mask |= u64::from(changed) << (4 * g);
            }
            // The upper two lanes load as zero in both: equal, never marked changed.
            let v = _mm_loadl_epi64(ev.add(16 * GROUPS).cast::<__m128i>());
            let p = _mm_loadl_epi64(pv.add(16 * GROUPS).cast::<__m128i>());
            _mm_storel_epi64(pv.add(16 * GROUPS).cast::<__m128i>(), v);
            let changed = group(v, p, o.add(n));
            n += 4 * changed.count_ones() as usize;
            mask |= u64::from(changed) << (4 * GROUPS);
        }
        (mask, n)
    }
}

/// The context and mask of an event record's header; `Err` names what is wrong.
pub fn parse_header(header: &[u8; EVENT_HEADER_LEN]) -> Result<(u8, u64), String> {
    let mut mask_bytes = [0u8; 8];
    mask_bytes[..EVENT_HEADER_LEN - 2].copy_from_slice(&header[2..]);
    let mask = u64::from_le_bytes(mask_bytes);
    if mask & !MASK_BITS != 0 {
        return Err(format!(
            "field `changed`: {mask:#x} has bits above the event's {EVENT_WORDS} words"
        ));
    }
    Ok((header[1], mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seed: u32, hook: u16) -> [u8; EVENT_SIZE] {
        let mut e = [0u8; EVENT_SIZE];
        for i in 0..EVENT_WORDS {
            // Some words constant, some changing with the seed, some zero.
            let w = match i % 3 {
                0 => 7,
                1 => seed.wrapping_mul(2_654_435_761).rotate_left(i as u32),
                _ => 0,
            };
            e[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        e[4 * HOOK_WORD..4 * HOOK_WORD + 2].copy_from_slice(&hook.to_le_bytes());
        e
    }

    #[test]
    fn decoding_what_was_encoded_gives_the_events_back() {
        let (mut enc, mut dec) = (Contexts::default(), Contexts::default());
        let hooks = [3u16, 3, 9, 3, 9, 300, 65_535, 300];
        let mut lengths = Vec::new();
        for (seed, hook) in hooks.iter().enumerate() {
            let ev = event(seed as u32 / 2, *hook);
            let mut out = [0u8; EVENT_SLOT];
            let n = enc.encode(3, &ev, &mut out);
            let header: &[u8; EVENT_HEADER_LEN] = out[..EVENT_HEADER_LEN].try_into().unwrap();
            let (context, mask) = parse_header(header).unwrap();
            assert_eq!(out[0], 3);
            assert_eq!(context, (*hook).min(255) as u8);
            assert_eq!(n, EVENT_HEADER_LEN + 4 * mask.count_ones() as usize);
            let mut back = [0u8; EVENT_SIZE];
            dec.decode(context, mask, &out[EVENT_HEADER_LEN..n], &mut back);
            assert_eq!(back, ev, "event {seed}");
            lengths.push(n);
        }
        // The second event of hook 3 repeats the first one: a header and nothing else.
        assert_eq!(lengths[1], EVENT_HEADER_LEN);
        // Hooks 300 and 65535 share context 255: each differs from the one before in its hook
        // word at least.
        assert!(lengths[6] > EVENT_HEADER_LEN && lengths[7] > EVENT_HEADER_LEN);
    }

    #[test]
    fn the_simd_and_the_scalar_encoders_write_the_same_records() {
        let mut checked = 0;
        for simd in [Simd::Ssse3, Simd::Avx512] {
            if simd.available() {
                same_records(simd);
                checked += 1;
            }
        }
        eprintln!("{checked} SIMD encoders on this CPU compared with the scalar one");
        // Every x86_64 CPU this runs on has SSSE3: at least that encoder is compared.
        if cfg!(target_arch = "x86_64") {
            assert!(checked >= 1, "no SIMD encoder was compared");
        }
    }

    fn same_records(level: Simd) {
        let mut simd = Contexts::with_simd(level);
        let mut scalar = Contexts::with_simd(Simd::None);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..5_000u32 {
            // Random words, each kept from the previous event of its hook most of the time.
            let mut ev = event(i % 7, (i % 5) as u16);
            for w in 0..EVENT_WORDS {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if state.is_multiple_of(3) && w != HOOK_WORD {
                    ev[4 * w..4 * w + 4].copy_from_slice(&(state as u32).to_le_bytes());
                }
            }
            let (mut a, mut b) = ([0u8; EVENT_SLOT], [0u8; EVENT_SLOT]);
            let na = simd.encode(3, &ev, &mut a);
            let nb = scalar.encode(3, &ev, &mut b);
            assert_eq!(a[..na], b[..nb], "{level:?}: event {i}");
        }
    }

    #[test]
    fn a_mask_with_bits_beyond_the_event_is_refused() {
        let mut header = [3u8, 0, 0, 0, 0, 0, 0];
        header[6] = 0x04; // bit 34
        let err = parse_header(&header).unwrap_err();
        assert!(err.contains("field `changed`"), "{err}");
        header[6] = 0x03; // bits 32 and 33: the last two words
        assert_eq!(parse_header(&header).unwrap().1, 0x3_0000_0000);
    }
}
