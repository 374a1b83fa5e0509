//! BF16 and FP8 e4m3 conversions, bit-exact on the GPU and the host (round to nearest even).

/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// BF16 bits to f32.
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 to BF16 bits, rounding to nearest even (NaN stays NaN).
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> u16 {
    let bits = f.to_bits();
    if f.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// f32 to e4m3 (`float8_e4m3fn`) bits: round to nearest even, saturating at ±448; NaN to 0x7f.
#[inline(always)]
pub fn f32_to_e4m3(f: f32) -> u8 {
    let bits = f.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    if f.is_nan() {
        return 0x7f | sign;
    }
    let a = f32::from_bits(bits & 0x7fff_ffff);
    if a >= E4M3_MAX {
        return 0x7e | sign;
    }
    // Below the smallest normal (2^-6): multiples of 2^-9.
    if a < 0.015625 {
        let q = a * 512.0;
        let whole = q as u32;
        let frac = q - whole as f32;
        let m = if frac > 0.5 || (frac == 0.5 && whole & 1 == 1) {
            whole + 1
        } else {
            whole
        };
        return sign | m as u8;
    }
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 7;
    let mant = bits & 0x7f_ffff;
    let mut m = mant >> 20;
    let rest = mant & 0xf_ffff;
    if rest > 0x8_0000 || (rest == 0x8_0000 && m & 1 == 1) {
        m += 1;
    }
    let v = ((exp as u32) << 3) + m;
    sign | if v > 0x7e { 0x7e } else { v as u8 }
}

/// The smallest power of two at least `x` (a positive, finite, normal f32): `x` itself when its
/// mantissa is zero, else the next exponent (DeepEP's `round_scale`, so a scale is an exact
/// UE8M0 exponent).
#[inline(always)]
pub fn pow2_ceil(x: f32) -> f32 {
    let bits = x.to_bits();
    if bits & 0x7f_ffff == 0 {
        x
    } else {
        f32::from_bits((bits & 0xff80_0000) + 0x80_0000)
    }
}

/// e4m3 bits to f32.
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0xf) as u32;
    let m = (b & 7) as u32;
    if exp == 15 && m == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        return sign * m as f32 * (1.0 / 512.0);
    }
    sign * f32::from_bits(((exp + 120) << 23) | (m << 20))
}

#[cfg(test)]
mod tests {

    #[test]
    fn pow2_ceil_rounds_up_to_a_power_of_two() {
        assert_eq!(super::pow2_ceil(1.0), 1.0);
        assert_eq!(super::pow2_ceil(1.0001), 2.0);
        assert_eq!(super::pow2_ceil(0.75), 1.0);
        assert_eq!(super::pow2_ceil(3.0 / 448.0), 1.0 / 128.0);
        assert_eq!(super::pow2_ceil(2.5e-7), 2f32.powi(-21));
    }

    use super::*;

    #[test]
    fn bf16_round_trips_and_rounds_to_even() {
        for v in [0.0f32, 1.0, -2.5, 3.140625, 65280.0, -1.0e-3] {
            let b = f32_to_bf16(v);
            assert!((bf16_to_f32(b) - v).abs() <= v.abs() / 128.0, "{v}");
        }
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
    }

    #[test]
    fn e4m3_every_code_round_trips() {
        for b in 0u8..=255 {
            if b & 0x7f == 0x7f {
                assert!(e4m3_to_f32(b).is_nan());
                continue;
            }
            let f = e4m3_to_f32(b);
            let back = f32_to_e4m3(f);
            // -0 and +0 both decode to zero.
            if f == 0.0 {
                assert_eq!(back & 0x7f, 0);
            } else {
                assert_eq!(back, b, "code {b:#x} = {f}");
            }
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0);
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): to even.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(f32_to_e4m3(1000.0), 0x7e);
        assert_eq!(f32_to_e4m3(-1000.0), 0xfe);
        assert_eq!(f32_to_e4m3(f32::NAN) & 0x7f, 0x7f);
        // Relative error at most 2^-4 on normals.
        let mut x = 0.02f32;
        while x < 440.0 {
            let y = e4m3_to_f32(f32_to_e4m3(x));
            assert!((y - x).abs() <= x / 16.0, "{x} -> {y}");
            x *= 1.013;
        }
    }
}
