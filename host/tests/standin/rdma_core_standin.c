/*
 * A stand-in for libibverbs + libmlx5, loaded by the mlx5 backend exactly as the real libraries
 * are (host/tests/mlx5_standin.rs builds it as a shared object). It answers the entry points the
 * backend uses the way rdma-core does, including its failures (no device, a device another
 * provider drives, DEVX refused, dma-buf umem refused, a port that is down, a PRM command the
 * device rejects with a status and syndrome), records every call, and checks the PRM mailboxes it
 * receives against the kernel's mlx5_ifc.h field offsets, as firmware would read them.
 *
 * Test knobs: standin_reset(), standin_set(key, value), standin_log().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIT(n) (1UL << (n))
#define BIT_ULL(n) (1ULL << (n))
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;
typedef uint16_t __be16; typedef uint32_t __be32; typedef uint64_t __be64;
#include "mlx5_ifc.h"

#define AT(t, f) ((unsigned)offsetof(struct mlx5_ifc_##t##_bits, f))
#define WIDTH(t, f) ((unsigned)sizeof(((struct mlx5_ifc_##t##_bits *)0)->f))

/* Field reader over a big-endian PRM buffer (bit 0 = MSB of the first byte). */
static uint64_t get_bits(const void *buf, unsigned at, unsigned width) {
    const uint8_t *b = buf;
    uint64_t v = 0;
    for (unsigned i = 0; i < width; i++) {
        unsigned bit = at + i;
        v = (v << 1) | ((b[bit / 8] >> (7 - bit % 8)) & 1);
    }
    return v;
}
static void put_bits(void *buf, unsigned at, unsigned width, uint64_t v) {
    uint8_t *b = buf;
    for (unsigned i = 0; i < width; i++) {
        unsigned bit = at + width - 1 - i;
        uint8_t m = 1 << (7 - bit % 8);
        if ((v >> i) & 1) b[bit / 8] |= m; else b[bit / 8] &= ~m;
    }
}
#define GET(t, base, f) get_bits(in, (base) + AT(t, f), WIDTH(t, f))

/* ---------------------------------------------------------------- state and knobs */
static char logbuf[1 << 16];
static size_t loglen;
static struct {
    long devices;          /* 0: none; 1: mlx5_0; 2: rxe0 only; 3: rxe0 then mlx5_0 */
    long devx_refused;
    long dmabuf_refused;
    long peermem_refused;
    long nc_uar_refused;
    long port_down;
    long ethernet;
    long create_qp_status; /* nonzero: CREATE_QP fails with this status, syndrome 0x5a5a */
    long dmabuf_mr_refused;
    long mr_refused;
    long post_send_refused; /* verbs_standin.c: ibv_post_send fails with ENOMEM */
    long fail_next_wr;      /* verbs_standin.c: the next request completes with REM_ACCESS_ERR */
    long no_atomics;        /* verbs_standin.c: ibv_query_device reports IBV_ATOMIC_NONE */
    long max_qp_wr;         /* verbs_standin.c: the device's send-queue limit (0: 32768) */
} knobs;
static uint32_t next_id;
int standin_set(const char *key, long v);
void standin_live(int delta);
uint32_t standin_new_id(void);
static long live_objects; /* MRs, umems, UARs and DEVX objects not yet released */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&log_lock);
    int n = vsnprintf(logbuf + loglen, sizeof logbuf - loglen, fmt, ap);
    if (n > 0 && loglen + n + 1 < sizeof logbuf) { loglen += n; logbuf[loglen++] = '\n'; logbuf[loglen] = 0; }
    else logbuf[loglen] = 0;
    pthread_mutex_unlock(&log_lock);
    va_end(ap);
}

void standin_reset(void) {
    memset(&knobs, 0, sizeof knobs);
    knobs.devices = 1;
    loglen = 0; logbuf[0] = 0; next_id = 0x10; live_objects = 0;
}
int standin_set(const char *key, long v) {
#define K(k) if (!strcmp(key, #k)) { knobs.k = v; return 0; }
    K(devices) K(devx_refused) K(dmabuf_refused) K(peermem_refused) K(nc_uar_refused) K(port_down)
    K(ethernet) K(create_qp_status) K(dmabuf_mr_refused) K(mr_refused) K(post_send_refused) K(fail_next_wr) K(no_atomics) K(max_qp_wr)
    return -1;
}
/* Loaded by a program that sets no knobs (ibgda-probe on a GPU machine): one mlx5 device. */
__attribute__((constructor)) static void standin_defaults(void) { standin_reset(); }
const char *standin_log(void) { return logbuf; }
long standin_live_objects(void) { return live_objects; }

/* For verbs_standin.c. */
void standin_logf(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    logf_("%s", line);
}
uint32_t standin_new_id(void) { return __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED); }
void standin_live(int delta) { __atomic_fetch_add(&live_objects, delta, __ATOMIC_RELAXED); }
long standin_knob(const char *name) {
#define G(k) if (!strcmp(name, #k)) return __atomic_load_n(&knobs.k, __ATOMIC_RELAXED);
    G(post_send_refused) G(fail_next_wr) G(no_atomics) G(max_qp_wr)
    return 0;
}
void standin_knob_set(const char *name, long v) { (void)standin_set(name, v); }

/* ---------------------------------------------------------------- verbs */
struct ibv_device { char name[16]; bool mlx5; };
struct ibv_context { int open; };
struct ibv_pd { int pd; };
static struct ibv_device dev_mlx5 = { "mlx5_0", true }, dev_rxe = { "rxe0", false };
static struct ibv_device *list_storage[4];
static struct ibv_context the_ctx;
static struct ibv_pd the_pd;
#define PDN 0x42

struct ibv_device **ibv_get_device_list(int *n) {
    int k = 0;
    if (knobs.devices == 1) list_storage[k++] = &dev_mlx5;
    if (knobs.devices >= 2) list_storage[k++] = &dev_rxe;
    if (knobs.devices == 3) list_storage[k++] = &dev_mlx5;
    list_storage[k] = NULL;
    *n = k;
    logf_("ibv_get_device_list -> %d", k);
    return list_storage;
}
void ibv_free_device_list(struct ibv_device **l) { (void)l; logf_("ibv_free_device_list"); }
const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }
void standin_verbs_close(struct ibv_context *c);
int ibv_close_device(struct ibv_context *c) {
    logf_("ibv_close_device");
    if (c == &the_ctx) c->open = 0; else standin_verbs_close(c); /* a context of ibv_open_device */
    return 0;
}
struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) { (void)c; logf_("ibv_alloc_pd"); return &the_pd; }
int ibv_dealloc_pd(struct ibv_pd *p) { (void)p; logf_("ibv_dealloc_pd"); return 0; }

/* struct ibv_mr as verbs.h lays it out, then what the stand-in keeps. */
struct ibv_mr { struct ibv_context *context; struct ibv_pd *pd; void *addr; size_t length; uint32_t handle, lkey, rkey;
                int access; };
#define MAX_MRS 256
static struct ibv_mr *mrs[MAX_MRS];
static pthread_mutex_t mrs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_mr *new_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
    struct ibv_mr *m = calloc(1, sizeof *m);
    m->pd = pd; m->addr = addr; m->length = len; m->access = access;
    m->lkey = m->rkey = 0x1000 + standin_new_id(); /* mlx5: one mkey serves as both */
    pthread_mutex_lock(&mrs_lock);
    for (int i = 0; i < MAX_MRS; i++) if (!mrs[i]) { mrs[i] = m; break; }
    pthread_mutex_unlock(&mrs_lock);
    standin_live(1);
    return m;
}
/* 0 when [addr, addr+len) lies in a live region with key `key` and every `access` bit. */
int standin_mr_check(uint32_t key, uint64_t addr, uint64_t len, int access) {
    int ok = -1;
    pthread_mutex_lock(&mrs_lock);
    for (int i = 0; i < MAX_MRS; i++) {
        struct ibv_mr *m = mrs[i];
        if (m && m->lkey == key && addr >= (uint64_t)m->addr && addr + len <= (uint64_t)m->addr + m->length &&
            (m->access & access) == access) { ok = 0; break; }
    }
    pthread_mutex_unlock(&mrs_lock);
    return ok;
}
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
    logf_("ibv_reg_dmabuf_mr off=%llu len=%zu iova=%#llx fd=%d access=%#x", (unsigned long long)off, len,
          (unsigned long long)iova, fd, access);
    if (pd != &the_pd || knobs.dmabuf_mr_refused) { errno = knobs.dmabuf_mr_refused ? EOPNOTSUPP : EINVAL; return NULL; }
    return new_mr(pd, (void *)iova, len, access);
}
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
    logf_("ibv_reg_mr len=%zu access=%#x", len, access);
    if (pd != &the_pd || knobs.mr_refused) { errno = knobs.mr_refused ? EFAULT : EINVAL; return NULL; }
    return new_mr(pd, addr, len, access);
}
int ibv_dereg_mr(struct ibv_mr *m) {
    logf_("ibv_dereg_mr %#x", m->lkey);
    pthread_mutex_lock(&mrs_lock);
    for (int i = 0; i < MAX_MRS; i++) if (mrs[i] == m) mrs[i] = NULL;
    pthread_mutex_unlock(&mrs_lock);
    standin_live(-1);
    free(m);
    return 0;
}

/* The exported compat entry point: fills the prefix of struct ibv_port_attr. */
struct port_attr_prefix {
    uint32_t state, max_mtu, active_mtu; int gid_tbl_len; uint32_t port_cap_flags, max_msg_sz,
        bad_pkey_cntr, qkey_viol_cntr; uint16_t pkey_tbl_len, lid, sm_lid; uint8_t lmc, max_vl_num,
        sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer;
};
int ibv_query_port(struct ibv_context *c, uint8_t port, struct port_attr_prefix *a) {
    (void)c;
    logf_("ibv_query_port %u", port);
    memset(a, 0, sizeof *a);
    a->state = knobs.port_down ? 1 /* DOWN */ : 4 /* ACTIVE */;
    a->active_mtu = 5;
    a->lid = knobs.ethernet ? 0 : 7;
    a->link_layer = knobs.ethernet ? 2 : 1;
    return 0;
}
int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t gid[16]) {
    (void)c;
    logf_("ibv_query_gid %u %d", port, index);
    for (int i = 0; i < 16; i++) gid[i] = (uint8_t)(0xf0 + i);
    return 0;
}

/* ---------------------------------------------------------------- mlx5dv */
struct mlx5dv_context_attr { uint32_t flags; uint64_t comp_mask; };
struct mlx5dv_pd { uint32_t pdn; uint64_t comp_mask; };
struct pair { void *in, *out; };
struct mlx5dv_obj { struct pair qp, cq, srq, rwq, dm, ah, pd; };
struct mlx5dv_devx_uar { void *reg_addr; void *base_addr; uint32_t page_id; long mmap_off; uint64_t comp_mask; };
struct mlx5dv_devx_umem { uint32_t umem_id; };
struct mlx5dv_devx_umem_in { void *addr; size_t size; uint32_t access; uint64_t pgsz_bitmap; uint64_t comp_mask; int dmabuf_fd; };
struct mlx5dv_devx_obj {
    uint32_t kind, id;
    int state;          /* QPs: 0 RESET, 1 INIT, 2 RTR, 3 RTS */
    uint32_t cqn;       /* QPs: the send CQ */
    uint32_t umems[2];  /* the umems it names (queue, doorbell record) */
};
/* Live DEVX objects, so that releasing one still in use fails as firmware refuses it (EBUSY). */
#define MAX_OBJS 256
static struct mlx5dv_devx_obj *objs[MAX_OBJS];
static pthread_mutex_t objs_lock = PTHREAD_MUTEX_INITIALIZER;
static void track(struct mlx5dv_devx_obj *o, int add) {
    pthread_mutex_lock(&objs_lock);
    for (int i = 0; i < MAX_OBJS; i++)
        if (add ? !objs[i] : objs[i] == o) { objs[i] = add ? o : NULL; break; }
    pthread_mutex_unlock(&objs_lock);
}
/* Whether a live object other than `self` names CQ `cqn` (cqn != 0) or umem `umem` (umem != 0). */
static int in_use(struct mlx5dv_devx_obj *self, uint32_t cqn, uint32_t umem) {
    int used = 0;
    pthread_mutex_lock(&objs_lock);
    for (int i = 0; i < MAX_OBJS; i++) {
        struct mlx5dv_devx_obj *o = objs[i];
        if (!o || o == self) continue;
        if ((cqn && o->kind == 2 && o->cqn == cqn) || (umem && (o->umems[0] == umem || o->umems[1] == umem))) used = 1;
    }
    pthread_mutex_unlock(&objs_lock);
    return used;
}

static uint64_t uar_page[512] __attribute__((aligned(4096)));

bool mlx5dv_is_supported(struct ibv_device *d) { return d->mlx5; }
struct ibv_context *mlx5dv_open_device(struct ibv_device *d, struct mlx5dv_context_attr *a) {
    logf_("mlx5dv_open_device %s flags=%u", d->name, a ? a->flags : 0);
    if (knobs.devx_refused && a && (a->flags & 1)) { errno = EOPNOTSUPP; return NULL; }
    the_ctx.open = 1;
    return &the_ctx;
}
/* An address handle: the stand-in's mlx5 address vector carries a MAC derived from the GID (as
 * a link-local RoCE GID embeds its port's MAC); rmac sits at byte 20 as in mlx5dv.h. */
struct ibv_ah { struct ibv_context *context; struct ibv_pd *pd; uint32_t handle; uint8_t av[48]; };
struct mlx5dv_ah { uint8_t *av; uint64_t comp_mask; };
struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, const uint8_t *attr /* struct ibv_ah_attr: dgid first */) {
    if (pd != &the_pd) { errno = EINVAL; return NULL; }
    struct ibv_ah *ah = calloc(1, sizeof *ah);
    ah->av[20] = 0x02;
    memcpy(&ah->av[21], attr + 11, 5);
    logf_("ibv_create_ah dgid[15]=%#x", attr[15]);
    standin_live(1);
    return ah;
}
int ibv_destroy_ah(struct ibv_ah *ah) { logf_("ibv_destroy_ah"); standin_live(-1); free(ah); return 0; }

int mlx5dv_init_obj(struct mlx5dv_obj *o, uint64_t type) {
    logf_("mlx5dv_init_obj %#llx", (unsigned long long)type);
    if (type == (1 << 5)) {
        struct ibv_ah *ah = o->ah.in;
        ((struct mlx5dv_ah *)o->ah.out)->av = ah->av;
        return 0;
    }
    if (type != (1 << 6) || o->pd.in != &the_pd) { errno = EINVAL; return EINVAL; }
    ((struct mlx5dv_pd *)o->pd.out)->pdn = PDN;
    return 0;
}
int mlx5dv_devx_query_eqn(struct ibv_context *c, uint32_t vector, uint32_t *eqn) {
    (void)c;
    logf_("mlx5dv_devx_query_eqn %u", vector);
    *eqn = 9;
    return 0;
}
struct mlx5dv_devx_uar *mlx5dv_devx_alloc_uar(struct ibv_context *c, uint32_t type) {
    (void)c;
    logf_("mlx5dv_devx_alloc_uar type=%u", type);
    if (type == 1 && knobs.nc_uar_refused) { errno = ENOMEM; return NULL; }
    struct mlx5dv_devx_uar *u = calloc(1, sizeof *u);
    u->reg_addr = (char *)uar_page + 0x800;
    u->base_addr = uar_page;
    u->page_id = 0x77;
    standin_live(1);
    return u;
}
void mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *u) { logf_("mlx5dv_devx_free_uar"); standin_live(-1); free(u); }
struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg_ex(struct ibv_context *c, struct mlx5dv_devx_umem_in *in) {
    (void)c;
    logf_("mlx5dv_devx_umem_reg_ex fd=%d size=%zu access=%u mask=%llu", in->dmabuf_fd, in->size, in->access,
          (unsigned long long)in->comp_mask);
    if (knobs.dmabuf_refused) { errno = EOPNOTSUPP; return NULL; }
    struct mlx5dv_devx_umem *u = malloc(sizeof *u);
    u->umem_id = standin_new_id();
    standin_live(1);
    return u;
}
struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg(struct ibv_context *c, void *addr, size_t size, uint32_t access) {
    (void)c; (void)addr;
    logf_("mlx5dv_devx_umem_reg size=%zu access=%u", size, access);
    if (knobs.peermem_refused) { errno = EFAULT; return NULL; }
    struct mlx5dv_devx_umem *u = malloc(sizeof *u);
    u->umem_id = standin_new_id();
    standin_live(1);
    return u;
}
int mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *u) {
    logf_("mlx5dv_devx_umem_dereg %#x", u->umem_id);
    if (in_use(NULL, 0, u->umem_id)) { logf_("umem %#x still in use: EBUSY", u->umem_id); errno = EBUSY; return EBUSY; }
    standin_live(-1);
    free(u);
    return 0;
}

static void fail_out(void *out, size_t outlen, uint8_t status, uint32_t syndrome) {
    memset(out, 0, outlen);
    put_bits(out, AT(cmd_out, status), WIDTH(cmd_out, status), status);
    put_bits(out, AT(cmd_out, syndrome), WIDTH(cmd_out, syndrome), syndrome);
}

struct mlx5dv_devx_obj *mlx5dv_devx_obj_create(struct ibv_context *c, const void *in, size_t inlen, void *out,
                                               size_t outlen) {
    (void)c;
    unsigned op = (unsigned)get_bits(in, AT(cmd_in, opcode), WIDTH(cmd_in, opcode));
    if (op == 0x400 && inlen * 8 >= sizeof(struct mlx5_ifc_create_cq_in_bits)) {
        unsigned cqc = AT(create_cq_in, cq_context);
        logf_("CREATE_CQ log_cq_size=%llu uar_page=%#llx c_eqn=%llu cc=%llu oi=%llu cqe_sz=%llu dbr_umem_valid=%llu "
              "cq_umem_valid=%llu cq_umem_id=%#llx dbr_umem_id=%#llx",
              (unsigned long long)GET(cqc, cqc, log_cq_size), (unsigned long long)GET(cqc, cqc, uar_page),
              (unsigned long long)GET(cqc, cqc, c_eqn_or_apu_element), (unsigned long long)GET(cqc, cqc, cc),
              (unsigned long long)GET(cqc, cqc, oi), (unsigned long long)GET(cqc, cqc, cqe_sz),
              (unsigned long long)GET(cqc, cqc, dbr_umem_valid),
              (unsigned long long)GET(create_cq_in, 0, cq_umem_valid),
              /* Reserved in the kernel header; rdma-core's PRM places them here. */
              (unsigned long long)get_bits(in, 0x2c0, 32), (unsigned long long)get_bits(in, cqc + 0x20, 32));
        memset(out, 0, outlen);
        struct mlx5dv_devx_obj *o = calloc(1, sizeof *o);
        o->kind = 1; o->id = 0x100 + standin_new_id();
        o->umems[0] = (uint32_t)get_bits(in, 0x2c0, 32);
        o->umems[1] = (uint32_t)get_bits(in, cqc + 0x20, 32);
        track(o, 1);
        standin_live(1);
        put_bits(out, AT(create_cq_out, cqn), WIDTH(create_cq_out, cqn), o->id);
        return o;
    }
    if (op == 0x500 && inlen * 8 >= sizeof(struct mlx5_ifc_create_qp_in_bits)) {
        unsigned q = AT(create_qp_in, qpc);
        logf_("CREATE_QP st=%llu pm_state=%llu pd=%#llx uar_page=%#llx log_sq_size=%llu cqn_snd=%#llx rq_type=%llu "
              "wq_umem_valid=%llu wq_umem_id=%#llx dbr_umem_valid=%llu dbr_umem_id=%#llx",
              (unsigned long long)GET(qpc, q, st), (unsigned long long)GET(qpc, q, pm_state),
              (unsigned long long)GET(qpc, q, pd), (unsigned long long)GET(qpc, q, uar_page),
              (unsigned long long)GET(qpc, q, log_sq_size), (unsigned long long)GET(qpc, q, cqn_snd),
              (unsigned long long)GET(qpc, q, rq_type), (unsigned long long)GET(create_qp_in, 0, wq_umem_valid),
              (unsigned long long)get_bits(in, 0x840, 32), (unsigned long long)GET(qpc, q, dbr_umem_valid),
              (unsigned long long)get_bits(in, q + 0x720, 32));
        if (knobs.create_qp_status) {
            fail_out(out, outlen, (uint8_t)knobs.create_qp_status, 0x5a5a);
            errno = EREMOTEIO;
            return NULL;
        }
        if (GET(qpc, q, pd) != PDN) { fail_out(out, outlen, 0x3, 0xbad0); errno = EINVAL; return NULL; }
        memset(out, 0, outlen);
        struct mlx5dv_devx_obj *o = calloc(1, sizeof *o);
        o->kind = 2; o->id = 0x200 + standin_new_id();
        o->cqn = (uint32_t)GET(qpc, q, cqn_snd);
        o->umems[0] = (uint32_t)get_bits(in, 0x840, 32);
        o->umems[1] = (uint32_t)get_bits(in, q + 0x720, 32);
        track(o, 1);
        standin_live(1);
        put_bits(out, AT(create_qp_out, qpn), WIDTH(create_qp_out, qpn), o->id);
        return o;
    }
    logf_("obj_create unknown opcode %#x", op);
    fail_out(out, outlen, 0x2, 0); /* bad opcode */
    errno = EINVAL;
    return NULL;
}

int mlx5dv_devx_obj_modify(struct mlx5dv_devx_obj *o, const void *in, size_t inlen, void *out, size_t outlen) {
    (void)inlen;
    unsigned op = (unsigned)get_bits(in, AT(cmd_in, opcode), WIDTH(cmd_in, opcode));
    unsigned qpn = (unsigned)GET(rst2init_qp_in, 0, qpn);
    unsigned q = AT(rst2init_qp_in, qpc), a = q + AT(qpc, primary_address_path);
    int from = op - 0x502; /* RST2INIT from 0, INIT2RTR from 1, RTR2RTS from 2 */
    if (op == 0x502)
        logf_("RST2INIT qpn=%#x rwe=%llu rre=%llu rae=%llu port=%llu", qpn, (unsigned long long)GET(qpc, q, rwe),
              (unsigned long long)GET(qpc, q, rre), (unsigned long long)GET(qpc, q, rae),
              (unsigned long long)GET(ads, a, vhca_port_num));
    else if (op == 0x503)
        logf_("INIT2RTR qpn=%#x remote_qpn=%#llx mtu=%llu grh=%llu rlid=%llu rmac=%04llx%08llx udp_sport=%#llx", qpn,
              (unsigned long long)GET(qpc, q, remote_qpn), (unsigned long long)GET(qpc, q, mtu),
              (unsigned long long)GET(ads, a, grh), (unsigned long long)GET(ads, a, rlid),
              (unsigned long long)GET(ads, a, rmac_47_32), (unsigned long long)GET(ads, a, rmac_31_0),
              (unsigned long long)GET(ads, a, udp_sport));
    else if (op == 0x504)
        logf_("RTR2RTS qpn=%#x retry=%llu rnr_retry=%llu ack_timeout=%llu", qpn,
              (unsigned long long)GET(qpc, q, retry_count), (unsigned long long)GET(qpc, q, rnr_retry),
              (unsigned long long)GET(ads, a, ack_timeout));
    if (o->kind != 2 || qpn != o->id || from < 0 || from > 2 || from != o->state) {
        fail_out(out, outlen, 0x9, 0xbad1); /* bad resource state */
        errno = EREMOTEIO;
        return EREMOTEIO;
    }
    o->state++;
    memset(out, 0, outlen);
    return 0;
}

int mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *o) {
    logf_("mlx5dv_devx_obj_destroy %#x", o->id);
    if (o->kind == 1 && in_use(o, o->id, 0)) { logf_("CQ %#x still in use: EBUSY", o->id); errno = EBUSY; return EBUSY; }
    track(o, 0);
    standin_live(-1);
    free(o);
    return 0;
}
