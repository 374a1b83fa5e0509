//! A PRM mailbox: big-endian 32-bit words whose fields are set and read as `MLX5_SET` and
//! `MLX5_GET` do, with values that do not fit their field refused rather than truncated.

use std::fmt;

/// A field of a PRM layout: `bits` bits starting `at` bits from the layout's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Bit offset from the start of the layout (bit 0 = MSB of the first big-endian word).
    pub at: u32,
    /// Width in bits.
    pub bits: u32,
}

impl Field {
    pub(super) const fn new(at: u32, bits: u32) -> Field {
        Field { at, bits }
    }

    /// The field of a sub-layout placed `base` bits into an outer one.
    pub const fn within(self, base: u32) -> Field {
        Field {
            at: base + self.at,
            bits: self.bits,
        }
    }
}

/// A value that does not fit its field, or a field outside the buffer: a bug in the caller's
/// parameters, never silently truncated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrmError {
    /// The command being built.
    pub command: &'static str,
    /// The field's name.
    pub field: &'static str,
    /// What was wrong.
    pub why: String,
}

impl fmt::Display for PrmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mlx5 {}: field {}: {}", self.command, self.field, self.why)
    }
}

impl std::error::Error for PrmError {}

/// A command mailbox being built (or an output being read): big-endian words.
#[derive(Clone, PartialEq, Eq)]
pub struct Mailbox {
    command: &'static str,
    words: Vec<u32>,
}

impl fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [", self.command)?;
        for (i, w) in self.words.iter().enumerate() {
            if i > 0 {
                write!(f, " ")?;
            }
            write!(f, "{w:08x}")?;
        }
        write!(f, "]")
    }
}

impl Mailbox {
    /// A zeroed mailbox of `bits` bits (a multiple of 32) for `command`.
    pub fn new(command: &'static str, bits: u32) -> Mailbox {
        assert!(bits.is_multiple_of(32), "PRM layouts are whole words");
        Mailbox {
            command,
            words: vec![0; (bits / 32) as usize],
        }
    }

    /// A mailbox holding `bytes` as the device wrote them (an output).
    pub fn from_bytes(command: &'static str, bytes: &[u8]) -> Mailbox {
        Mailbox {
            command,
            words: bytes
                .chunks(4)
                .map(|c| {
                    let mut w = [0u8; 4];
                    w[..c.len()].copy_from_slice(c);
                    u32::from_be_bytes(w)
                })
                .collect(),
        }
    }

    fn check(&self, name: &'static str, f: Field) -> Result<(), PrmError> {
        let fits_words = f.bits <= 32 && f.at / 32 == (f.at + f.bits - 1) / 32;
        let whole_words = f.at.is_multiple_of(32) && f.bits.is_multiple_of(32) && f.bits <= 64;
        if f.bits == 0 || !(fits_words || whole_words) {
            return Err(self.error(name, format!("{f:?} is neither inside one word nor whole words")));
        }
        if (f.at + f.bits).div_ceil(32) as usize > self.words.len() {
            return Err(self.error(name, format!("{f:?} is past the {}-bit layout", self.words.len() * 32)));
        }
        Ok(())
    }

    fn error(&self, field: &'static str, why: String) -> PrmError {
        PrmError {
            command: self.command,
            field,
            why,
        }
    }

    /// Sets field `name` (`f`) to `v`; a value wider than the field is an error.
    pub fn set(&mut self, name: &'static str, f: Field, v: u64) -> Result<&mut Mailbox, PrmError> {
        self.check(name, f)?;
        if f.bits < 64 && v >> f.bits != 0 {
            return Err(self.error(name, format!("{v:#x} does not fit in {} bits", f.bits)));
        }
        let w = (f.at / 32) as usize;
        if f.bits > 32 {
            // Whole words, most significant first (MLX5_SET64).
            self.words[w] = (v >> 32) as u32;
            self.words[w + 1] = v as u32;
        } else {
            let shift = 32 - (f.at % 32) - f.bits;
            let mask = (((1u64 << f.bits) - 1) as u32) << shift;
            self.words[w] = (self.words[w] & !mask) | ((v as u32) << shift);
        }
        Ok(self)
    }

    /// Writes `bytes` over a byte-aligned field of exactly that many bytes (GIDs).
    pub fn set_bytes(&mut self, name: &'static str, f: Field, bytes: &[u8]) -> Result<&mut Mailbox, PrmError> {
        if !f.at.is_multiple_of(8) || f.bits != bytes.len() as u32 * 8 {
            return Err(self.error(name, format!("{f:?} is not {} whole bytes", bytes.len())));
        }
        if (f.at + f.bits).div_ceil(32) as usize > self.words.len() {
            return Err(self.error(name, format!("{f:?} is past the layout")));
        }
        for (i, b) in bytes.iter().enumerate() {
            let bit = f.at + 8 * i as u32;
            let (w, shift) = ((bit / 32) as usize, 24 - bit % 32);
            self.words[w] = (self.words[w] & !(0xff << shift)) | ((*b as u32) << shift);
        }
        Ok(self)
    }

    /// Reads field `f`.
    pub fn get(&self, f: Field) -> u64 {
        let w = (f.at / 32) as usize;
        if f.bits > 32 {
            ((self.words[w] as u64) << 32) | self.words[w + 1] as u64
        } else {
            let shift = 32 - (f.at % 32) - f.bits;
            ((self.words[w] >> shift) as u64) & ((1u64 << f.bits) - 1)
        }
    }

    /// The mailbox as the device reads it.
    pub fn bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    /// The command's name.
    pub fn command(&self) -> &'static str {
        self.command
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::mlx5::prm::layout::{cmd_in, cqc, modify_qp_in};

    #[test]
    fn fields_land_where_mlx5_set_puts_them() {
        let mut m = Mailbox::new("t", 0x80);
        // opcode: the top 16 bits of word 0, big-endian.
        m.set("opcode", cmd_in::OPCODE, 0x0500).unwrap();
        assert_eq!(&m.bytes()[..4], &[0x05, 0x00, 0x00, 0x00]);
        // A 24-bit field at bit 0x48: the low 24 bits of word 2.
        m.set("qpn", modify_qp_in::QPN, 0xab_cdef).unwrap();
        assert_eq!(&m.bytes()[8..12], &[0x00, 0xab, 0xcd, 0xef]);
        // A one-bit field in the middle of a word keeps its neighbours.
        let mut c = Mailbox::new("t", cqc::BITS);
        c.set("cqe_sz", cqc::CQE_SZ, 0b101)
            .unwrap()
            .set("cc", cqc::CC, 1)
            .unwrap();
        assert_eq!(c.bytes()[1], 0b1011_0000);
        assert_eq!((c.get(cqc::CQE_SZ), c.get(cqc::CC), c.get(cqc::OI)), (0b101, 1, 0));
        // 64-bit fields: two whole words, most significant first.
        c.set("dbr_addr", cqc::DBR_ADDR, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(
            &c.bytes()[0x38..0x40],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
    }
}
