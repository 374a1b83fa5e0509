//! Checks the rdma-core signatures `ibgda::nic::rdma_core` loads at run time against Debian's
//! `infiniband/verbs.h` and `infiniband/mlx5dv.h`: a C program assigns each function to a pointer
//! of the type the Rust side declares (spelled here in C, one line per Rust `type`), compiled with
//! `-Werror`, so a drifted signature fails to compile. A deliberately wrong signature is compiled
//! too and must fail, so the check can fail. `scripts/setup-toolchain.sh` installs the headers.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The Rust declarations, in C (host/src/nic/rdma_core.rs: GetDeviceList, FreeDeviceList,
/// GetDeviceName, Mlx5dvIsSupported; host/src/nic/mlx5/ffi.rs: the rest). `ibv_query_gid`'s
/// `union ibv_gid *` is a `*mut [u8; 16]` on the Rust side (the union is 16 raw bytes).
const DECLARED: &str = r#"
typedef struct ibv_device **(*get_device_list_t)(int *num_devices);
typedef void (*free_device_list_t)(struct ibv_device **list);
typedef const char *(*get_device_name_t)(struct ibv_device *device);
typedef bool (*mlx5dv_is_supported_t)(struct ibv_device *device);
get_device_list_t get_device_list = ibv_get_device_list;
free_device_list_t free_device_list = ibv_free_device_list;
get_device_name_t get_device_name = ibv_get_device_name;
mlx5dv_is_supported_t is_supported = mlx5dv_is_supported;

/* host/src/nic/mlx5/ffi.rs */
typedef int (*close_device_t)(struct ibv_context *);
typedef int (*query_port_t)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
typedef int (*query_gid_t)(struct ibv_context *, uint8_t, int, union ibv_gid *);
typedef struct ibv_pd *(*alloc_pd_t)(struct ibv_context *);
typedef int (*dealloc_pd_t)(struct ibv_pd *);
typedef struct ibv_context *(*open_device_t)(struct ibv_device *, struct mlx5dv_context_attr *);
typedef int (*init_obj_t)(struct mlx5dv_obj *, uint64_t);
typedef int (*query_eqn_t)(struct ibv_context *, uint32_t, uint32_t *);
typedef struct mlx5dv_devx_uar *(*alloc_uar_t)(struct ibv_context *, uint32_t);
typedef void (*free_uar_t)(struct mlx5dv_devx_uar *);
typedef struct mlx5dv_devx_umem *(*umem_reg_t)(struct ibv_context *, void *, size_t, uint32_t);
typedef struct mlx5dv_devx_umem *(*umem_reg_ex_t)(struct ibv_context *, struct mlx5dv_devx_umem_in *);
typedef int (*umem_dereg_t)(struct mlx5dv_devx_umem *);
typedef struct mlx5dv_devx_obj *(*obj_create_t)(struct ibv_context *, const void *, size_t, void *, size_t);
typedef int (*obj_modify_t)(struct mlx5dv_devx_obj *, const void *, size_t, void *, size_t);
typedef int (*obj_destroy_t)(struct mlx5dv_devx_obj *);
typedef struct ibv_mr *(*reg_mr_t)(struct ibv_pd *, void *, size_t, int);
typedef struct ibv_mr *(*reg_dmabuf_mr_t)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
typedef int (*dereg_mr_t)(struct ibv_mr *);
close_device_t close_device = ibv_close_device;
/* The exported symbol, not verbs.h's inline wrapper of the same name. */
#undef ibv_query_port
query_port_t query_port = ibv_query_port;
query_gid_t query_gid = ibv_query_gid;
alloc_pd_t alloc_pd = ibv_alloc_pd;
dealloc_pd_t dealloc_pd = ibv_dealloc_pd;
open_device_t open_device = mlx5dv_open_device;
init_obj_t init_obj = mlx5dv_init_obj;
query_eqn_t query_eqn = mlx5dv_devx_query_eqn;
alloc_uar_t alloc_uar = mlx5dv_devx_alloc_uar;
free_uar_t free_uar = mlx5dv_devx_free_uar;
umem_reg_t umem_reg = mlx5dv_devx_umem_reg;
umem_reg_ex_t umem_reg_ex = mlx5dv_devx_umem_reg_ex;
umem_dereg_t umem_dereg = mlx5dv_devx_umem_dereg;
obj_create_t obj_create = mlx5dv_devx_obj_create;
obj_modify_t obj_modify = mlx5dv_devx_obj_modify;
obj_destroy_t obj_destroy = mlx5dv_devx_obj_destroy;
/* The exported symbol, not verbs.h's macro of the same name. */
#undef ibv_reg_mr
reg_mr_t reg_mr = ibv_reg_mr;
reg_dmabuf_mr_t reg_dmabuf_mr = ibv_reg_dmabuf_mr;
dereg_mr_t dereg_mr = ibv_dereg_mr;
typedef struct ibv_ah *(*create_ah_t)(struct ibv_pd *, struct ibv_ah_attr *);
typedef int (*destroy_ah_t)(struct ibv_ah *);
create_ah_t create_ah = ibv_create_ah;
destroy_ah_t destroy_ah = ibv_destroy_ah;

/* host/src/nic/verbs/ffi.rs */
typedef struct ibv_context *(*v_open_device_t)(struct ibv_device *);
typedef int (*query_device_t)(struct ibv_context *, struct ibv_device_attr *);
typedef struct ibv_cq *(*create_cq_t)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
typedef int (*destroy_cq_t)(struct ibv_cq *);
typedef struct ibv_qp *(*create_qp_t)(struct ibv_pd *, struct ibv_qp_init_attr *);
typedef int (*destroy_qp_t)(struct ibv_qp *);
typedef int (*modify_qp_t)(struct ibv_qp *, struct ibv_qp_attr *, int);
typedef int (*post_send_t)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
typedef int (*poll_cq_t)(struct ibv_cq *, int, struct ibv_wc *);
v_open_device_t v_open_device = ibv_open_device;
query_device_t query_device = ibv_query_device;
create_cq_t create_cq = ibv_create_cq;
destroy_cq_t destroy_cq = ibv_destroy_cq;
create_qp_t create_qp = ibv_create_qp;
destroy_qp_t destroy_qp = ibv_destroy_qp;
modify_qp_t modify_qp = ibv_modify_qp;
/* The two context operations the header's inline ibv_post_send and ibv_poll_cq call. */
void ops_types(struct ibv_context *c) {
    post_send_t ps = c->ops.post_send;
    poll_cq_t pc = c->ops.poll_cq;
    (void)ps; (void)pc;
}
"#;

/// Compiles `body` (C, after the rdma-core headers) with `-Wall -Werror`: to an object when
/// `main` is `None`, else linked into a program whose `main` is that text. Returns the compiler's
/// output and what it wrote.
fn cc(name: &str, body: &str, main: Option<&str>) -> (Output, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rdma_core_ffi");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let program_main = main.unwrap_or("return 0;");
    std::fs::write(
        &src,
        format!(
            "#include <stdbool.h>\n#include <infiniband/verbs.h>\n#include <infiniband/mlx5dv.h>\n{body}\nint main(void) {{ {program_main} }}\n"
        ),
    )
    .unwrap();
    let (out_file, mode): (PathBuf, &[&str]) = match main {
        None => (dir.join(format!("{name}.o")), &["-Wno-unused-variable", "-c"]),
        Some(_) => (dir.join(name), &[]),
    };
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror"])
        .args(mode)
        .arg("-o")
        .arg(&out_file)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` ({e}); run scripts/setup-toolchain.sh"));
    (out, out_file)
}

fn compile(name: &str, body: &str) -> Output {
    cc(name, body, None).0
}

#[test]
fn the_loaded_signatures_match_the_rdma_core_headers() {
    let out = compile("declared", DECLARED);
    assert!(
        out.status.success(),
        "a signature in host/src/nic/rdma_core.rs no longer matches rdma-core's headers (or libibverbs-dev is missing: run scripts/setup-toolchain.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_wrong_signature_is_caught() {
    let wrong = DECLARED.replace(
        "typedef const char *(*get_device_name_t)(struct ibv_device *device);",
        "typedef int (*get_device_name_t)(struct ibv_device *device);",
    );
    assert_ne!(wrong, DECLARED);
    assert!(
        !compile("wrong", &wrong).status.success(),
        "the check would not catch a drifted signature"
    );
}

/// Sizes, field offsets and constants of the structs `host/src/nic/mlx5/ffi.rs` declares, from
/// the headers, compared with the Rust declarations.
#[test]
fn the_mlx5_backend_structs_match_the_headers() {
    use ibgda::nic::mlx5::ffi::*;
    use std::mem::{offset_of, size_of};
    let body = r#"
#include <stdio.h>
#include <stddef.h>
#define SZ(t) printf("sizeof %s %zu\n", #t, sizeof(struct t))
#define OFF(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(struct t, f))
#define V(c) printf("value %s %llu\n", #c, (unsigned long long)(c))
static void facts(void) {
    SZ(mlx5dv_context_attr); OFF(mlx5dv_context_attr, flags); OFF(mlx5dv_context_attr, comp_mask);
    SZ(mlx5dv_pd); OFF(mlx5dv_pd, pdn); OFF(mlx5dv_pd, comp_mask);
    SZ(mlx5dv_obj); OFF(mlx5dv_obj, pd.in); OFF(mlx5dv_obj, pd.out);
    SZ(mlx5dv_devx_uar); OFF(mlx5dv_devx_uar, reg_addr); OFF(mlx5dv_devx_uar, base_addr);
    OFF(mlx5dv_devx_uar, page_id); OFF(mlx5dv_devx_uar, mmap_off); OFF(mlx5dv_devx_uar, comp_mask);
    SZ(mlx5dv_devx_umem); OFF(mlx5dv_devx_umem, umem_id);
    SZ(mlx5dv_devx_umem_in); OFF(mlx5dv_devx_umem_in, addr); OFF(mlx5dv_devx_umem_in, size);
    OFF(mlx5dv_devx_umem_in, access); OFF(mlx5dv_devx_umem_in, pgsz_bitmap);
    OFF(mlx5dv_devx_umem_in, comp_mask); OFF(mlx5dv_devx_umem_in, dmabuf_fd);
    SZ(ibv_port_attr); OFF(ibv_port_attr, state); OFF(ibv_port_attr, active_mtu); OFF(ibv_port_attr, lid);
    OFF(ibv_port_attr, link_layer); OFF(ibv_port_attr, port_cap_flags2);
    SZ(mlx5dv_ah); OFF(mlx5dv_ah, av); OFF(mlx5_wqe_av, rmac); V(MLX5DV_OBJ_AH); OFF(mlx5dv_obj, ah.in);
    SZ(ibv_mr); OFF(ibv_mr, addr); OFF(ibv_mr, length); OFF(ibv_mr, lkey); OFF(ibv_mr, rkey);
    OFF(ibv_context, ops.poll_cq); OFF(ibv_context, ops.post_send);
    OFF(ibv_qp, context); OFF(ibv_qp, qp_num); OFF(ibv_cq, context);
    SZ(ibv_qp_cap); SZ(ibv_qp_init_attr); OFF(ibv_qp_init_attr, send_cq); OFF(ibv_qp_init_attr, cap);
    OFF(ibv_qp_init_attr, qp_type); OFF(ibv_qp_init_attr, sq_sig_all);
    SZ(ibv_global_route); OFF(ibv_global_route, sgid_index); OFF(ibv_global_route, traffic_class);
    SZ(ibv_ah_attr); OFF(ibv_ah_attr, dlid); OFF(ibv_ah_attr, is_global); OFF(ibv_ah_attr, port_num);
    SZ(ibv_qp_attr); OFF(ibv_qp_attr, path_mtu); OFF(ibv_qp_attr, rq_psn); OFF(ibv_qp_attr, sq_psn);
    OFF(ibv_qp_attr, dest_qp_num); OFF(ibv_qp_attr, qp_access_flags); OFF(ibv_qp_attr, ah_attr);
    OFF(ibv_qp_attr, pkey_index); OFF(ibv_qp_attr, max_rd_atomic); OFF(ibv_qp_attr, max_dest_rd_atomic);
    OFF(ibv_qp_attr, min_rnr_timer); OFF(ibv_qp_attr, port_num); OFF(ibv_qp_attr, timeout);
    OFF(ibv_qp_attr, retry_cnt); OFF(ibv_qp_attr, rnr_retry); OFF(ibv_qp_attr, rate_limit);
    SZ(ibv_sge); OFF(ibv_sge, length); OFF(ibv_sge, lkey);
    SZ(ibv_send_wr); OFF(ibv_send_wr, sg_list); OFF(ibv_send_wr, num_sge); OFF(ibv_send_wr, opcode);
    OFF(ibv_send_wr, send_flags); OFF(ibv_send_wr, wr.rdma.remote_addr); OFF(ibv_send_wr, wr.rdma.rkey);
    OFF(ibv_send_wr, wr.atomic.compare_add); OFF(ibv_send_wr, wr.atomic.swap); OFF(ibv_send_wr, wr.atomic.rkey);
    SZ(ibv_device_attr); OFF(ibv_device_attr, max_qp_wr); OFF(ibv_device_attr, max_qp_rd_atom);
    OFF(ibv_device_attr, max_qp_init_rd_atom); OFF(ibv_device_attr, atomic_cap); OFF(ibv_device_attr, phys_port_cnt);
    V(IBV_ATOMIC_NONE);
    SZ(ibv_wc); OFF(ibv_wc, status); OFF(ibv_wc, opcode); OFF(ibv_wc, byte_len); OFF(ibv_wc, qp_num);
    V(IBV_QPT_RC); V(IBV_QPS_INIT); V(IBV_QPS_RTR); V(IBV_QPS_RTS); V(IBV_QP_STATE); V(IBV_QP_ACCESS_FLAGS);
    V(IBV_QP_PKEY_INDEX); V(IBV_QP_PORT); V(IBV_QP_AV); V(IBV_QP_PATH_MTU); V(IBV_QP_TIMEOUT);
    V(IBV_QP_RETRY_CNT); V(IBV_QP_RNR_RETRY); V(IBV_QP_RQ_PSN); V(IBV_QP_MAX_QP_RD_ATOMIC);
    V(IBV_QP_MIN_RNR_TIMER); V(IBV_QP_SQ_PSN); V(IBV_QP_MAX_DEST_RD_ATOMIC); V(IBV_QP_DEST_QPN);
    V(IBV_WR_RDMA_WRITE); V(IBV_WR_RDMA_READ); V(IBV_WR_ATOMIC_CMP_AND_SWP); V(IBV_WR_ATOMIC_FETCH_AND_ADD);
    V(IBV_SEND_SIGNALED); V(IBV_SEND_INLINE); V(IBV_WC_SUCCESS);
    V(MLX5DV_CONTEXT_FLAGS_DEVX); V(MLX5DV_OBJ_PD); V(MLX5DV_UAR_ALLOC_TYPE_BF); V(MLX5DV_UAR_ALLOC_TYPE_NC);
    V(MLX5DV_UMEM_MASK_DMABUF); V(IBV_ACCESS_LOCAL_WRITE); V(IBV_PORT_ACTIVE);
    V(IBV_LINK_LAYER_INFINIBAND); V(IBV_LINK_LAYER_ETHERNET);
}
"#;
    let facts = run_program("layouts", body);
    let want: Vec<(&str, u64)> = vec![
        ("sizeof mlx5dv_context_attr", size_of::<Mlx5dvContextAttr>() as u64),
        ("sizeof ibv_mr", size_of::<IbvMr>() as u64),
        ("sizeof mlx5dv_ah", size_of::<Mlx5dvAh>() as u64),
        ("offsetof mlx5dv_ah.av", offset_of!(Mlx5dvAh, av) as u64),
        ("offsetof mlx5_wqe_av.rmac", MLX5_WQE_AV_RMAC as u64),
        ("value MLX5DV_OBJ_AH", MLX5DV_OBJ_AH),
        (
            "offsetof mlx5dv_obj.ah.in",
            (offset_of!(Mlx5dvObj, ah) + offset_of!(ObjPair, inp)) as u64,
        ),
        ("offsetof ibv_mr.addr", offset_of!(IbvMr, addr) as u64),
        ("offsetof ibv_mr.length", offset_of!(IbvMr, length) as u64),
        ("offsetof ibv_mr.lkey", offset_of!(IbvMr, lkey) as u64),
        ("offsetof ibv_mr.rkey", offset_of!(IbvMr, rkey) as u64),
        (
            "offsetof mlx5dv_context_attr.flags",
            offset_of!(Mlx5dvContextAttr, flags) as u64,
        ),
        (
            "offsetof mlx5dv_context_attr.comp_mask",
            offset_of!(Mlx5dvContextAttr, comp_mask) as u64,
        ),
        ("sizeof mlx5dv_pd", size_of::<Mlx5dvPd>() as u64),
        ("offsetof mlx5dv_pd.pdn", offset_of!(Mlx5dvPd, pdn) as u64),
        ("offsetof mlx5dv_pd.comp_mask", offset_of!(Mlx5dvPd, comp_mask) as u64),
        ("sizeof mlx5dv_obj", size_of::<Mlx5dvObj>() as u64),
        (
            "offsetof mlx5dv_obj.pd.in",
            (offset_of!(Mlx5dvObj, pd) + offset_of!(ObjPair, inp)) as u64,
        ),
        (
            "offsetof mlx5dv_obj.pd.out",
            (offset_of!(Mlx5dvObj, pd) + offset_of!(ObjPair, out)) as u64,
        ),
        ("sizeof mlx5dv_devx_uar", size_of::<Mlx5dvDevxUar>() as u64),
        (
            "offsetof mlx5dv_devx_uar.reg_addr",
            offset_of!(Mlx5dvDevxUar, reg_addr) as u64,
        ),
        (
            "offsetof mlx5dv_devx_uar.base_addr",
            offset_of!(Mlx5dvDevxUar, base_addr) as u64,
        ),
        (
            "offsetof mlx5dv_devx_uar.page_id",
            offset_of!(Mlx5dvDevxUar, page_id) as u64,
        ),
        (
            "offsetof mlx5dv_devx_uar.mmap_off",
            offset_of!(Mlx5dvDevxUar, mmap_off) as u64,
        ),
        (
            "offsetof mlx5dv_devx_uar.comp_mask",
            offset_of!(Mlx5dvDevxUar, comp_mask) as u64,
        ),
        ("sizeof mlx5dv_devx_umem", size_of::<Mlx5dvDevxUmem>() as u64),
        (
            "offsetof mlx5dv_devx_umem.umem_id",
            offset_of!(Mlx5dvDevxUmem, umem_id) as u64,
        ),
        ("sizeof mlx5dv_devx_umem_in", size_of::<Mlx5dvDevxUmemIn>() as u64),
        (
            "offsetof mlx5dv_devx_umem_in.addr",
            offset_of!(Mlx5dvDevxUmemIn, addr) as u64,
        ),
        (
            "offsetof mlx5dv_devx_umem_in.size",
            offset_of!(Mlx5dvDevxUmemIn, size) as u64,
        ),
        (
            "offsetof mlx5dv_devx_umem_in.access",
            offset_of!(Mlx5dvDevxUmemIn, access) as u64,
        ),
        (
            "offsetof mlx5dv_devx_umem_in.pgsz_bitmap",
            offset_of!(Mlx5dvDevxUmemIn, pgsz_bitmap) as u64,
        ),
        (
            "offsetof mlx5dv_devx_umem_in.comp_mask",
            offset_of!(Mlx5dvDevxUmemIn, comp_mask) as u64,
        ),
        (
            "offsetof mlx5dv_devx_umem_in.dmabuf_fd",
            offset_of!(Mlx5dvDevxUmemIn, dmabuf_fd) as u64,
        ),
        ("sizeof ibv_port_attr", size_of::<IbvPortAttr>() as u64),
        ("offsetof ibv_port_attr.state", offset_of!(IbvPortAttr, state) as u64),
        (
            "offsetof ibv_port_attr.active_mtu",
            offset_of!(IbvPortAttr, active_mtu) as u64,
        ),
        ("offsetof ibv_port_attr.lid", offset_of!(IbvPortAttr, lid) as u64),
        (
            "offsetof ibv_port_attr.link_layer",
            offset_of!(IbvPortAttr, link_layer) as u64,
        ),
        (
            "offsetof ibv_port_attr.port_cap_flags2",
            offset_of!(IbvPortAttr, port_cap_flags2) as u64,
        ),
        ("value MLX5DV_CONTEXT_FLAGS_DEVX", MLX5DV_CONTEXT_FLAGS_DEVX as u64),
        ("value MLX5DV_OBJ_PD", MLX5DV_OBJ_PD),
        ("value MLX5DV_UAR_ALLOC_TYPE_BF", MLX5DV_UAR_ALLOC_TYPE_BF as u64),
        ("value MLX5DV_UAR_ALLOC_TYPE_NC", MLX5DV_UAR_ALLOC_TYPE_NC as u64),
        ("value MLX5DV_UMEM_MASK_DMABUF", MLX5DV_UMEM_MASK_DMABUF),
        ("value IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as u64),
        ("value IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as u64),
        ("value IBV_LINK_LAYER_INFINIBAND", IBV_LINK_LAYER_INFINIBAND as u64),
        ("value IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as u64),
    ];
    let mut want = want;
    want.extend(verbs_facts());
    for (name, ours) in &want {
        assert_eq!(
            facts.get(*name),
            Some(ours),
            "{name}: header vs host/src/nic/mlx5/ffi.rs"
        );
    }
    assert_eq!(facts.len(), want.len(), "every printed fact is compared");
}

/// Builds `body` (which defines `facts()`) into a program that calls it, runs it, and returns its
/// `key value` lines.
fn run_program(name: &str, body: &str) -> std::collections::BTreeMap<String, u64> {
    let (out, bin) = cc(name, body, Some("facts(); return 0;"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&bin).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// The verbs proxy's declarations (`host/src/nic/verbs/ffi.rs`), as the C program prints them.
fn verbs_facts() -> Vec<(&'static str, u64)> {
    use ibgda::nic::verbs::ffi::*;
    use std::mem::{offset_of, size_of};
    let wr = offset_of!(IbvSendWr, wr) as u64;
    vec![
        ("offsetof ibv_context.ops.poll_cq", CONTEXT_OPS_POLL_CQ as u64),
        ("sizeof ibv_device_attr", size_of::<IbvDeviceAttr>() as u64),
        (
            "offsetof ibv_device_attr.max_qp_wr",
            offset_of!(IbvDeviceAttr, max_qp_wr) as u64,
        ),
        (
            "offsetof ibv_device_attr.max_qp_rd_atom",
            offset_of!(IbvDeviceAttr, max_qp_rd_atom) as u64,
        ),
        (
            "offsetof ibv_device_attr.max_qp_init_rd_atom",
            offset_of!(IbvDeviceAttr, max_qp_init_rd_atom) as u64,
        ),
        (
            "offsetof ibv_device_attr.atomic_cap",
            offset_of!(IbvDeviceAttr, atomic_cap) as u64,
        ),
        (
            "offsetof ibv_device_attr.phys_port_cnt",
            offset_of!(IbvDeviceAttr, phys_port_cnt) as u64,
        ),
        ("value IBV_ATOMIC_NONE", IBV_ATOMIC_NONE as u64),
        ("offsetof ibv_context.ops.post_send", CONTEXT_OPS_POST_SEND as u64),
        ("offsetof ibv_qp.context", offset_of!(IbvQp, context) as u64),
        ("offsetof ibv_qp.qp_num", offset_of!(IbvQp, qp_num) as u64),
        ("offsetof ibv_cq.context", offset_of!(IbvCq, context) as u64),
        ("sizeof ibv_qp_cap", size_of::<IbvQpCap>() as u64),
        ("sizeof ibv_qp_init_attr", size_of::<IbvQpInitAttr>() as u64),
        (
            "offsetof ibv_qp_init_attr.send_cq",
            offset_of!(IbvQpInitAttr, send_cq) as u64,
        ),
        ("offsetof ibv_qp_init_attr.cap", offset_of!(IbvQpInitAttr, cap) as u64),
        (
            "offsetof ibv_qp_init_attr.qp_type",
            offset_of!(IbvQpInitAttr, qp_type) as u64,
        ),
        (
            "offsetof ibv_qp_init_attr.sq_sig_all",
            offset_of!(IbvQpInitAttr, sq_sig_all) as u64,
        ),
        ("sizeof ibv_global_route", size_of::<IbvGlobalRoute>() as u64),
        (
            "offsetof ibv_global_route.sgid_index",
            offset_of!(IbvGlobalRoute, sgid_index) as u64,
        ),
        (
            "offsetof ibv_global_route.traffic_class",
            offset_of!(IbvGlobalRoute, traffic_class) as u64,
        ),
        ("sizeof ibv_ah_attr", size_of::<IbvAhAttr>() as u64),
        ("offsetof ibv_ah_attr.dlid", offset_of!(IbvAhAttr, dlid) as u64),
        (
            "offsetof ibv_ah_attr.is_global",
            offset_of!(IbvAhAttr, is_global) as u64,
        ),
        ("offsetof ibv_ah_attr.port_num", offset_of!(IbvAhAttr, port_num) as u64),
        ("sizeof ibv_qp_attr", size_of::<IbvQpAttr>() as u64),
        ("offsetof ibv_qp_attr.path_mtu", offset_of!(IbvQpAttr, path_mtu) as u64),
        ("offsetof ibv_qp_attr.rq_psn", offset_of!(IbvQpAttr, rq_psn) as u64),
        ("offsetof ibv_qp_attr.sq_psn", offset_of!(IbvQpAttr, sq_psn) as u64),
        (
            "offsetof ibv_qp_attr.dest_qp_num",
            offset_of!(IbvQpAttr, dest_qp_num) as u64,
        ),
        (
            "offsetof ibv_qp_attr.qp_access_flags",
            offset_of!(IbvQpAttr, qp_access_flags) as u64,
        ),
        ("offsetof ibv_qp_attr.ah_attr", offset_of!(IbvQpAttr, ah_attr) as u64),
        (
            "offsetof ibv_qp_attr.pkey_index",
            offset_of!(IbvQpAttr, pkey_index) as u64,
        ),
        (
            "offsetof ibv_qp_attr.max_rd_atomic",
            offset_of!(IbvQpAttr, max_rd_atomic) as u64,
        ),
        (
            "offsetof ibv_qp_attr.max_dest_rd_atomic",
            offset_of!(IbvQpAttr, max_dest_rd_atomic) as u64,
        ),
        (
            "offsetof ibv_qp_attr.min_rnr_timer",
            offset_of!(IbvQpAttr, min_rnr_timer) as u64,
        ),
        ("offsetof ibv_qp_attr.port_num", offset_of!(IbvQpAttr, port_num) as u64),
        ("offsetof ibv_qp_attr.timeout", offset_of!(IbvQpAttr, timeout) as u64),
        (
            "offsetof ibv_qp_attr.retry_cnt",
            offset_of!(IbvQpAttr, retry_cnt) as u64,
        ),
        (
            "offsetof ibv_qp_attr.rnr_retry",
            offset_of!(IbvQpAttr, rnr_retry) as u64,
        ),
        (
            "offsetof ibv_qp_attr.rate_limit",
            offset_of!(IbvQpAttr, rate_limit) as u64,
        ),
        ("sizeof ibv_sge", size_of::<IbvSge>() as u64),
        ("offsetof ibv_sge.length", offset_of!(IbvSge, length) as u64),
        ("offsetof ibv_sge.lkey", offset_of!(IbvSge, lkey) as u64),
        ("sizeof ibv_send_wr", size_of::<IbvSendWr>() as u64),
        ("offsetof ibv_send_wr.sg_list", offset_of!(IbvSendWr, sg_list) as u64),
        ("offsetof ibv_send_wr.num_sge", offset_of!(IbvSendWr, num_sge) as u64),
        ("offsetof ibv_send_wr.opcode", offset_of!(IbvSendWr, opcode) as u64),
        (
            "offsetof ibv_send_wr.send_flags",
            offset_of!(IbvSendWr, send_flags) as u64,
        ),
        ("offsetof ibv_send_wr.wr.rdma.remote_addr", wr),
        ("offsetof ibv_send_wr.wr.rdma.rkey", wr + 8),
        ("offsetof ibv_send_wr.wr.atomic.compare_add", wr + 8),
        ("offsetof ibv_send_wr.wr.atomic.swap", wr + 16),
        ("offsetof ibv_send_wr.wr.atomic.rkey", wr + 24),
        ("sizeof ibv_wc", size_of::<IbvWc>() as u64),
        ("offsetof ibv_wc.status", offset_of!(IbvWc, status) as u64),
        ("offsetof ibv_wc.opcode", offset_of!(IbvWc, opcode) as u64),
        ("offsetof ibv_wc.byte_len", offset_of!(IbvWc, byte_len) as u64),
        ("offsetof ibv_wc.qp_num", offset_of!(IbvWc, qp_num) as u64),
        ("value IBV_QPT_RC", IBV_QPT_RC as u64),
        ("value IBV_QPS_INIT", IBV_QPS_INIT as u64),
        ("value IBV_QPS_RTR", IBV_QPS_RTR as u64),
        ("value IBV_QPS_RTS", IBV_QPS_RTS as u64),
        ("value IBV_QP_STATE", IBV_QP_STATE as u64),
        ("value IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as u64),
        ("value IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as u64),
        ("value IBV_QP_PORT", IBV_QP_PORT as u64),
        ("value IBV_QP_AV", IBV_QP_AV as u64),
        ("value IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as u64),
        ("value IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as u64),
        ("value IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as u64),
        ("value IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as u64),
        ("value IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as u64),
        ("value IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as u64),
        ("value IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as u64),
        ("value IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as u64),
        ("value IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC as u64),
        ("value IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as u64),
        ("value IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as u64),
        ("value IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as u64),
        ("value IBV_WR_ATOMIC_CMP_AND_SWP", IBV_WR_ATOMIC_CMP_AND_SWP as u64),
        ("value IBV_WR_ATOMIC_FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD as u64),
        ("value IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as u64),
        ("value IBV_SEND_INLINE", IBV_SEND_INLINE as u64),
        ("value IBV_WC_SUCCESS", IBV_WC_SUCCESS as u64),
    ]
}
