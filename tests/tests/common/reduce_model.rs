// The host's model of the device reductions, shared by the CPU cases (`device_api_cases.rs`)
// and the GPU suite (`gpu.rs`). Needs `random_bytes` in scope.

/// `count` elements of the reduction type `ty` for each of `n` PEs, as bytes: integers from every
/// bit pattern, floats of both signs and several magnitudes (no NaN: the result is compared bit
/// for bit).
fn reduce_inputs(ty: u32, n: usize, count: usize, seed: u64) -> Vec<Vec<u8>> {
    use ibgda_kernels::reduce::ty;
    (0..n)
        .map(|pe| {
            let raw = random_bytes(seed * 10 + pe as u64, count * 8);
            let word = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
            let float = |i: usize| ((word(i) >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * [1.0, 3e-3, 7e4][i % 3];
            (0..count)
                .flat_map(|i| match ty {
                    ty::U8 => vec![word(i) as u8],
                    ty::I32 => (word(i) as i32).to_le_bytes().to_vec(),
                    ty::U64 => word(i).to_le_bytes().to_vec(),
                    ty::F32 => (float(i) as f32).to_le_bytes().to_vec(),
                    _ => float(i).to_le_bytes().to_vec(),
                })
                .collect()
        })
        .collect()
}

/// What the reduction `op` of type `ty` leaves in every PE's `dst`: each element folded over the
/// PEs in PE order (the order the device reduces in, so floats agree to the bit).
fn reduce_expected(op: u32, ty: u32, inputs: &[Vec<u8>]) -> Vec<u8> {
    use ibgda_kernels::reduce::{self, ty};
    macro_rules! fold {
        ($t:ty, $arith:expr, $bits:expr) => {{
            let w = core::mem::size_of::<$t>();
            let at = |pe: usize, i: usize| <$t>::from_le_bytes(inputs[pe][i * w..(i + 1) * w].try_into().unwrap());
            let f: fn($t, $t) -> $t = match op {
                reduce::SUM | reduce::PROD | reduce::MIN | reduce::MAX => $arith,
                _ => $bits,
            };
            (0..inputs[0].len() / w)
                .flat_map(|i| (1..inputs.len()).fold(at(0, i), |acc, pe| f(acc, at(pe, i))).to_le_bytes())
                .collect()
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            fold!(
                $t,
                match op {
                    reduce::SUM => <$t>::wrapping_add,
                    reduce::PROD => <$t>::wrapping_mul,
                    reduce::MIN => <$t>::min,
                    _ => <$t>::max,
                },
                match op {
                    reduce::AND => |a, b| a & b,
                    reduce::OR => |a, b| a | b,
                    _ => |a, b| a ^ b,
                }
            )
        };
    }
    macro_rules! float {
        ($t:ty) => {
            fold!(
                $t,
                match op {
                    reduce::SUM => |a, b| a + b,
                    reduce::PROD => |a, b| a * b,
                    reduce::MIN => <$t>::min,
                    _ => <$t>::max,
                },
                |_, _| unreachable!("no bitwise reduction of floats")
            )
        };
    }
    match ty {
        ty::U8 => int!(u8),
        ty::I32 => int!(i32),
        ty::U64 => int!(u64),
        ty::F32 => float!(f32),
        _ => float!(f64),
    }
}
