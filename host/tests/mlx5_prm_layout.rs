//! Every PRM field the mlx5 backend sets (`ibgda::nic::mlx5::prm`) against the kernel's
//! `include/linux/mlx5/mlx5_ifc.h` (Debian's `linux-headers-*-common`, which
//! `scripts/setup-toolchain.sh` installs): a C program built here prints each field's bit offset
//! and width as the header declares it (one `u8` per bit, so `offsetof` and `sizeof` count bits),
//! and the test compares them with ours one by one. Fields the kernel header leaves reserved must
//! lie inside the reserved gap between the declared neighbours named in the table. The command
//! opcodes and the enumeration values the header defines are compared too.
//!
//! `IBGDA_MLX5_IFC_H` names the header explicitly; without it the newest
//! `/usr/src/linux-headers-*-common` copy is used. No header, or no C compiler, fails the test
//! and says how to get one.

use ibgda::nic::mlx5::prm::{self, opcode, value, FieldCheck, MODIFY_QP_LAYOUTS};
use std::collections::BTreeMap;
#[path = "common/mlx5_ifc.rs"]
mod mlx5_ifc;

use std::process::Command;

/// The C structs a check applies to (the shared modify-QP shape is checked for all three).
fn c_structs(check: &FieldCheck) -> Vec<&'static str> {
    if check.layout == "modify_qp_in" {
        MODIFY_QP_LAYOUTS.to_vec()
    } else {
        vec![check.layout]
    }
}

fn c_program(checks: &[FieldCheck]) -> String {
    let mut c = String::from(
        r#"#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
/* What the kernel header expects from the kernel's own headers. */
#define BIT(n) (1UL << (n))
#define BIT_ULL(n) (1ULL << (n))
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;
typedef uint16_t __be16; typedef uint32_t __be32; typedef uint64_t __be64;
#include "mlx5_ifc.h"
#define AT(t, f) (unsigned)offsetof(struct mlx5_ifc_##t##_bits, f)
#define BITS(t, f) (unsigned)sizeof(((struct mlx5_ifc_##t##_bits *)0)->f)
#define FIELD(t, f) printf("field %s.%s %u %u\n", #t, #f, AT(t, f), BITS(t, f))
#define SIZE(t) printf("size %s %u\n", #t, (unsigned)sizeof(struct mlx5_ifc_##t##_bits))
#define VALUE(v) printf("value %s %llu\n", #v, (unsigned long long)(v))
int main(void) {
"#,
    );
    let mut layouts = std::collections::BTreeSet::new();
    for ch in checks {
        for t in c_structs(ch) {
            layouts.insert(t);
            match ch.reserved_between {
                None => c.push_str(&format!("    FIELD({t}, {});\n", ch.c_member)),
                Some((prev, next)) => {
                    c.push_str(&format!("    FIELD({t}, {prev});\n"));
                    if !next.is_empty() {
                        c.push_str(&format!("    FIELD({t}, {next});\n"));
                    }
                }
            }
        }
    }
    for t in &layouts {
        c.push_str(&format!("    SIZE({t});\n"));
    }
    for v in [
        "MLX5_CMD_OP_CREATE_CQ",
        "MLX5_CMD_OP_CREATE_QP",
        "MLX5_CMD_OP_RST2INIT_QP",
        "MLX5_CMD_OP_INIT2RTR_QP",
        "MLX5_CMD_OP_RTR2RTS_QP",
        "MLX5_QPC_ST_RC",
        "MLX5_QPC_PM_STATE_MIGRATED",
    ] {
        c.push_str(&format!("    VALUE({v});\n"));
    }
    c.push_str("    return 0;\n}\n");
    c
}

/// Compiles and runs the program against the header: `field`, `size` and `value` lines, parsed.
fn header_facts(checks: &[FieldCheck]) -> (BTreeMap<String, (u32, u32)>, BTreeMap<String, u64>) {
    let h = mlx5_ifc::header();
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ibgda-prm-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("prm.c");
    let bin = dir.join("prm");
    std::fs::write(&src, c_program(checks)).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-I")
        .arg(mlx5_ifc::include_dir())
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("no C compiler ({cc}: {e}): run scripts/setup-toolchain.sh"));
    assert!(
        out.status.success(),
        "compiling against {}:\n{}",
        h.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&bin).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    let (mut fields, mut values) = (BTreeMap::new(), BTreeMap::new());
    for line in String::from_utf8(run.stdout).unwrap().lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[..] {
            ["field", name, at, bits] => {
                fields.insert(name.to_string(), (at.parse().unwrap(), bits.parse().unwrap()));
            }
            ["size", name, bits] => {
                fields.insert(format!("{name}.<size>"), (0, bits.parse().unwrap()));
            }
            ["value", name, v] => {
                values.insert(name.to_string(), v.parse().unwrap());
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (fields, values)
}

#[test]
fn every_prm_field_we_set_matches_the_kernel_mlx5_ifc_header() {
    let checks = prm::all_checks();
    assert!(checks.len() >= 80, "{} checks", checks.len());
    let (fields, values) = header_facts(&checks);
    let mut compared = 0;
    for ch in &checks {
        for t in c_structs(ch) {
            let ours = (ch.field.at, ch.field.bits);
            match ch.reserved_between {
                None => {
                    let theirs = fields[&format!("{t}.{}", ch.c_member)];
                    assert_eq!(ours, theirs, "{t}.{}: ours (offset, bits) vs mlx5_ifc.h", ch.c_member);
                }
                Some((prev, next)) => {
                    let (p_at, p_bits) = fields[&format!("{t}.{prev}")];
                    let end = if next.is_empty() {
                        fields[&format!("{t}.<size>")].1
                    } else {
                        fields[&format!("{t}.{next}")].0
                    };
                    assert!(
                        p_at + p_bits <= ours.0 && ours.0 + ours.1 <= end,
                        "{t}.{} at {ours:?} must lie in the reserved gap [{:#x}, {end:#x}) after {prev}",
                        ch.c_member,
                        p_at + p_bits
                    );
                }
            }
            compared += 1;
        }
    }
    // Each layout's size, for the mailboxes we allocate.
    for (name, bits) in [
        ("cqc", prm::cqc::BITS),
        ("qpc", prm::qpc::BITS),
        ("ads", prm::ads::BITS),
        ("create_cq_in", prm::create_cq_in::BITS),
        ("create_qp_in", prm::create_qp_in::BITS),
        ("rst2init_qp_in", prm::modify_qp_in::BITS),
        ("init2rtr_qp_in", prm::modify_qp_in::BITS),
        ("rtr2rts_qp_in", prm::modify_qp_in::BITS),
    ] {
        assert_eq!(fields[&format!("{name}.<size>")].1, bits, "size of {name}");
    }
    for (name, ours) in [
        ("MLX5_CMD_OP_CREATE_CQ", opcode::CREATE_CQ as u64),
        ("MLX5_CMD_OP_CREATE_QP", opcode::CREATE_QP as u64),
        ("MLX5_CMD_OP_RST2INIT_QP", opcode::RST2INIT_QP as u64),
        ("MLX5_CMD_OP_INIT2RTR_QP", opcode::INIT2RTR_QP as u64),
        ("MLX5_CMD_OP_RTR2RTS_QP", opcode::RTR2RTS_QP as u64),
        ("MLX5_QPC_ST_RC", value::QP_ST_RC),
        ("MLX5_QPC_PM_STATE_MIGRATED", value::PM_STATE_MIGRATED),
    ] {
        assert_eq!(values[name], ours, "{name}");
    }
    assert!(compared >= 90, "compared {compared}");
}

#[test]
fn a_wrong_offset_would_be_caught() {
    // The comparison is not vacuous: a field moved by one bit disagrees with the header.
    let mut checks = prm::all_checks();
    let (fields, _) = header_facts(&checks);
    let ch = checks
        .iter_mut()
        .find(|c| c.layout == "qpc" && c.c_member == "log_sq_size")
        .unwrap();
    ch.field.at += 1;
    assert_ne!((ch.field.at, ch.field.bits), fields["qpc.log_sq_size"]);
}
