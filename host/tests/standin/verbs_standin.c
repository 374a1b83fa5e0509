/*
 * The standard-verbs half of the rdma-core stand-in (linked with rdma_core_standin.c into one
 * shared object): ibv_open_device, CQs, RC QPs and their state machine, and the two context
 * operations the header's inline ibv_post_send and ibv_poll_cq call. Built against the real
 * <infiniband/verbs.h>, so every struct the backend hands in is read with rdma-core's own layout.
 *
 * It executes what is posted, as a NIC would, between PEs of one process: RDMA WRITE (inline or
 * from a registered buffer), RDMA READ, 8-byte fetch-and-add and compare-and-swap, each checked
 * against the registered regions' bounds and access rights (rdma_core_standin.c keeps them), and
 * completes signalled requests in order. A failed request completes with an error status and moves
 * the QP to ERR; later requests flush. Knobs: post_send_refused, fail_next_wr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

/* From rdma_core_standin.c. */
void standin_logf(const char *fmt, ...);
int standin_mr_check(uint32_t key, uint64_t addr, uint64_t len, int access);
uint32_t standin_new_id(void);
void standin_live(int delta);
long standin_knob(const char *name);
void standin_knob_set(const char *name, long v);

struct standin_qp {
    struct ibv_qp qp;
    uint32_t dest;
    uint32_t max_send_wr, max_inline;
    uint64_t seq;  /* requests posted */
    uint64_t done; /* requests whose send-queue slots a polled completion freed */
};

/* A completion, with the QP and request it frees the send queue up to. */
struct entry { struct ibv_wc wc; struct standin_qp *qp; uint64_t seq; };

struct standin_cq {
    struct ibv_cq cq;
    pthread_mutex_t lock;
    int size, head, count, overrun;
    struct entry *ring;
};

static void push_wc(struct standin_qp *q, uint64_t wr_id, enum ibv_wc_status status, enum ibv_wc_opcode op) {
    struct standin_cq *c = (struct standin_cq *)q->qp.send_cq;
    pthread_mutex_lock(&c->lock);
    if (c->count == c->size) {
        /* As a NIC does: the CQ is in error from now on (the QP's owner sized it too small). */
        c->overrun = 1;
        pthread_mutex_unlock(&c->lock);
        standin_logf("CQ overrun (%d entries)", c->size);
        return;
    }
    struct entry *e = &c->ring[(c->head + c->count) % c->size];
    memset(e, 0, sizeof *e);
    e->wc.wr_id = wr_id; e->wc.status = status; e->wc.opcode = op; e->wc.qp_num = q->qp.qp_num;
    e->qp = q; e->seq = q->seq;
    c->count++;
    pthread_mutex_unlock(&c->lock);
}

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    struct standin_cq *c = (struct standin_cq *)cq;
    pthread_mutex_lock(&c->lock);
    if (c->overrun) { pthread_mutex_unlock(&c->lock); return -1; }
    int k = 0;
    while (k < n && c->count > 0) {
        struct entry *e = &c->ring[c->head];
        wc[k++] = e->wc;
        __atomic_store_n(&e->qp->done, e->seq, __ATOMIC_RELEASE);
        c->head = (c->head + 1) % c->size;
        c->count--;
    }
    pthread_mutex_unlock(&c->lock);
    return k;
}

/* Stores `len` bytes as the NIC's DMA would, whole aligned words at once (a peer may be polling them). */
static void dma_write(void *dst, const void *src, uint64_t len) {
    if (len == 8 && ((uintptr_t)dst & 7) == 0) {
        uint64_t v; memcpy(&v, src, 8); __atomic_store_n((uint64_t *)dst, v, __ATOMIC_RELEASE);
    } else if (len == 4 && ((uintptr_t)dst & 3) == 0) {
        uint32_t v; memcpy(&v, src, 4); __atomic_store_n((uint32_t *)dst, v, __ATOMIC_RELEASE);
    } else {
        memcpy(dst, src, len);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
    }
}

static enum ibv_wc_status execute(struct ibv_send_wr *wr, enum ibv_wc_opcode *op) {
    if (wr->num_sge != 1) return IBV_WC_LOC_LEN_ERR;
    uint64_t laddr = wr->sg_list[0].addr, len = wr->sg_list[0].length;
    uint32_t lkey = wr->sg_list[0].lkey;
    switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE: {
        *op = IBV_WC_RDMA_WRITE;
        if (!(wr->send_flags & IBV_SEND_INLINE) && standin_mr_check(lkey, laddr, len, 0)) return IBV_WC_LOC_PROT_ERR;
        if (standin_mr_check(wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, len, IBV_ACCESS_REMOTE_WRITE))
            return IBV_WC_REM_ACCESS_ERR;
        dma_write((void *)wr->wr.rdma.remote_addr, (void *)laddr, len);
        return IBV_WC_SUCCESS;
    }
    case IBV_WR_RDMA_READ:
        *op = IBV_WC_RDMA_READ;
        if (standin_mr_check(lkey, laddr, len, IBV_ACCESS_LOCAL_WRITE)) return IBV_WC_LOC_PROT_ERR;
        if (standin_mr_check(wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, len, IBV_ACCESS_REMOTE_READ))
            return IBV_WC_REM_ACCESS_ERR;
        dma_write((void *)laddr, (void *)wr->wr.rdma.remote_addr, len);
        return IBV_WC_SUCCESS;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_CMP_AND_SWP: {
        *op = wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? IBV_WC_FETCH_ADD : IBV_WC_COMP_SWAP;
        uint64_t raddr = wr->wr.atomic.remote_addr;
        if (len != 8 || standin_mr_check(lkey, laddr, 8, IBV_ACCESS_LOCAL_WRITE)) return IBV_WC_LOC_PROT_ERR;
        if ((raddr & 7) || standin_mr_check(wr->wr.atomic.rkey, raddr, 8, IBV_ACCESS_REMOTE_ATOMIC))
            return IBV_WC_REM_ACCESS_ERR;
        uint64_t old;
        if (wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
            old = __atomic_fetch_add((uint64_t *)raddr, wr->wr.atomic.compare_add, __ATOMIC_SEQ_CST);
        } else {
            old = wr->wr.atomic.compare_add;
            __atomic_compare_exchange_n((uint64_t *)raddr, &old, wr->wr.atomic.swap, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
        }
        dma_write((void *)laddr, &old, 8);
        return IBV_WC_SUCCESS;
    }
    default:
        *op = IBV_WC_SEND;
        return IBV_WC_LOC_QP_OP_ERR;
    }
}

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    struct standin_qp *q = (struct standin_qp *)qp;
    if (standin_knob("post_send_refused")) {
        standin_logf("post_send qpn=%#x refused", qp->qp_num);
        *bad = wr;
        return ENOMEM;
    }
    for (; wr; wr = wr->next) {
        if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) { *bad = wr; return EINVAL; }
        /* A full send queue: slots free only when a completion of a later request is polled. */
        if (q->seq - __atomic_load_n(&q->done, __ATOMIC_ACQUIRE) >= q->max_send_wr) {
            standin_logf("post_send qpn=%#x: send queue full (%u requests outstanding)", qp->qp_num, q->max_send_wr);
            *bad = wr;
            return ENOMEM;
        }
        if ((wr->send_flags & IBV_SEND_INLINE) && wr->num_sge == 1 && wr->sg_list[0].length > q->max_inline) {
            standin_logf("post_send qpn=%#x: %u inline bytes, at most %u", qp->qp_num, wr->sg_list[0].length, q->max_inline);
            *bad = wr;
            return EINVAL;
        }
        q->seq++;
        enum ibv_wc_opcode op = IBV_WC_SEND;
        enum ibv_wc_status st;
        if (qp->state == IBV_QPS_ERR) {
            st = IBV_WC_WR_FLUSH_ERR;
        } else if (standin_knob("fail_next_wr")) {
            standin_knob_set("fail_next_wr", 0);
            st = IBV_WC_REM_ACCESS_ERR;
        } else {
            st = execute(wr, &op);
        }
        if (st != IBV_WC_SUCCESS) qp->state = IBV_QPS_ERR;
        if (st != IBV_WC_SUCCESS || (wr->send_flags & IBV_SEND_SIGNALED)) push_wc(q, wr->wr_id, st, op);
    }
    return 0;
}

int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
    (void)c;
    memset(a, 0, sizeof *a);
    a->max_qp_wr = standin_knob("max_qp_wr") ? (int)standin_knob("max_qp_wr") : 32768;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->atomic_cap = standin_knob("no_atomics") ? IBV_ATOMIC_NONE : IBV_ATOMIC_HCA;
    a->phys_port_cnt = 1;
    return 0;
}

struct ibv_context *ibv_open_device(struct ibv_device *d) {
    standin_logf("ibv_open_device");
    if (!d) { errno = EINVAL; return NULL; }
    struct ibv_context *c = calloc(1, sizeof *c);
    c->device = d;
    c->ops.poll_cq = poll_cq;
    c->ops.post_send = post_send;
    standin_live(1);
    return c;
}
void standin_verbs_close(struct ibv_context *c) { standin_live(-1); free(c); }

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch, int vec) {
    (void)cq_context; (void)ch; (void)vec;
    standin_logf("ibv_create_cq cqe=%d", cqe);
    if (cqe < 1) { errno = EINVAL; return NULL; }
    struct standin_cq *c = calloc(1, sizeof *c);
    c->cq.context = ctx;
    c->cq.cqe = cqe;
    c->size = cqe;
    c->ring = calloc((size_t)cqe, sizeof *c->ring);
    pthread_mutex_init(&c->lock, NULL);
    standin_live(1);
    return &c->cq;
}
int ibv_destroy_cq(struct ibv_cq *cq) {
    struct standin_cq *c = (struct standin_cq *)cq;
    standin_logf("ibv_destroy_cq");
    free(c->ring); free(c);
    standin_live(-1);
    return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
    if (a->qp_type != IBV_QPT_RC || !a->send_cq || a->cap.max_send_wr < 1) { errno = EINVAL; return NULL; }
    long limit = standin_knob("max_qp_wr");
    if (limit && a->cap.max_send_wr > (uint32_t)limit) { errno = EINVAL; return NULL; } /* beyond the device */
    struct standin_qp *q = calloc(1, sizeof *q);
    q->qp.context = a->send_cq->context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_num = 0x300 + standin_new_id();
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    q->max_send_wr = a->cap.max_send_wr;
    q->max_inline = a->cap.max_inline_data;
    standin_logf("ibv_create_qp qpn=%#x max_send_wr=%u max_inline_data=%u", q->qp.qp_num, a->cap.max_send_wr,
                 a->cap.max_inline_data);
    standin_live(1);
    return &q->qp;
}
int ibv_destroy_qp(struct ibv_qp *qp) {
    standin_logf("ibv_destroy_qp %#x", qp->qp_num);
    free(qp);
    standin_live(-1);
    return 0;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
    struct standin_qp *q = (struct standin_qp *)qp;
    int from = qp->state, to = (mask & IBV_QP_STATE) ? (int)a->qp_state : from;
    int need = to == IBV_QPS_INIT ? (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
             : to == IBV_QPS_RTR ? (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
             : to == IBV_QPS_RTS ? (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC)
             : 0;
    if (to == IBV_QPS_RTR)
        standin_logf("ibv_modify_qp RTR qpn=%#x dest=%#x mtu=%d global=%d dlid=%u sgid_index=%u port=%u", qp->qp_num,
                     a->dest_qp_num, a->path_mtu, a->ah_attr.is_global, a->ah_attr.dlid, a->ah_attr.grh.sgid_index,
                     a->ah_attr.port_num);
    else
        standin_logf("ibv_modify_qp qpn=%#x %d->%d mask=%#x", qp->qp_num, from, to, mask);
    if (to != from + 1 || need == 0 || (mask & need) != need) { errno = EINVAL; return EINVAL; }
    if (to == IBV_QPS_RTR) q->dest = a->dest_qp_num;
    qp->state = to;
    return 0;
}
