/*
 * Rank 0's choice of the way an operation runs on the lane where there are two (lane.h): a
 * split AllReduce plain or by CPU group, an AlltoAll's blocks copied through the slots or read
 * single-copy. Per size class and kind, the default way (plain; copied) is timed, the other
 * tried now and then, and the faster taken.
 */
#include "links/link.h"
#include "sched/lane_impl.h"

/* The first operations of a class fault their buffers in: not timed. Then the plain way is
 * timed, and after CHOICE_PROBE_OPS operations and CHOICE_PROBE_NS the grouped one tried; a
 * try is a run of CHOICE_PROBE_LEN operations, at least CHOICE_PROBE_OPS operations and
 * CHOICE_PROBE_NS apart. */
#define CHOICE_WARM_OPS 2
#define CHOICE_PROBE_LEN 4 /* median4 takes four */
#define CHOICE_PROBE_OPS 32
#define CHOICE_PROBE_NS (50 * 1000 * 1000)
#define CHOICE_MARGIN 0.9
/* Above this the grouped way's extra pass over the data costs more than it saves, whether
 * copies between the CPUs are slow or not (docs/performance.md). */
#define CHOICE_GROUPED_MAX (2u << 20)
/* Rank 0's words, one per size class and kind: split AllReduces' from word 0, for their
 * CHOICE_GROUPED_CLASSES classes (up to CHOICE_GROUPED_MAX); AlltoAlls' from word
 * CHOICE_DIRECT_WORD0, for classes from CHOICE_DIRECT_CLASS0 (64 KiB: a smaller block's
 * single-copy read costs more in its system call than its copy) up to the largest block. */
#define CHOICE_GROUPED_CLASSES 21
#define CHOICE_DIRECT_CLASS0 15
#define CHOICE_DIRECT_WORD0 (HCCL_WINDOW_WORDS - 9)
_Static_assert((2u << (CHOICE_GROUPED_CLASSES - 1)) == CHOICE_GROUPED_MAX &&
                   CHOICE_GROUPED_CLASSES <= CHOICE_DIRECT_WORD0,
               "split AllReduces' words end before AlltoAlls' begin");
_Static_assert((2u << (CHOICE_DIRECT_CLASS0 + HCCL_WINDOW_WORDS - CHOICE_DIRECT_WORD0 - 1)) ==
                   HCCL_WINDOW_CAP,
               "an AlltoAll's classes, up to the largest block, have a word each");

/*
 * Rank 0's figures for one size class of one kind: ns per byte from an operation's
 * publication to the next one's, the default way [0] and the other [1]. Single operations
 * vary widely where several ranks share a CPU, so the other way is tried for a run of
 * operations, whose middle samples replace its figure.
 */
struct lane_choice {
    double ns_per_byte[2];
    uint32_t decided;           /* operations of the class whose way was chosen */
    uint32_t since_probe;       /* of them, since the last try */
    int64_t probed_ns;
    int probe_left;             /* operations of the current try still to be chosen */
    bool next_probe;            /* the way written for the next operation is a try */
    double probe[CHOICE_PROBE_LEN]; /* the current try's samples */
    int probe_n;
    int probe_skip;             /* the first try's first samples, not counted */
    bool tried;                 /* the first try has started */
};

static int mode_class(size_t bytes)
{
    int c = 0;

    while (c < HCCL_WINDOW_WORDS - 1 && ((size_t)2 << c) <= bytes)
        c++;
    return c;
}

/* Rank 0: whether the next operation of class c takes the other way, and whether it is a try. */
static bool choice_next(lane_choice_t *c, int64_t gap_ns, bool *probe)
{
    /* The other way only by a margin: where the two are close, four noisy samples would pick
     * grouping's extra pass, which is then the slower (docs/performance.md). */
    bool best = c->ns_per_byte[1] != 0 && c->ns_per_byte[1] < CHOICE_MARGIN * c->ns_per_byte[0];

    *probe = false;
    /* A class first runs the default way for CHOICE_PROBE_OPS operations and gap_ns: the
     * other's first try costs (grouped, its first operations fault pages in, each several times
     * a plain one: docs/performance.md), which a class used only briefly never repays. */
    if (++c->decided == 1)
        c->probed_ns = hccl_now_ns();
    if (c->decided < CHOICE_PROBE_OPS)
        return false;
    /* Only where the default way got timed: where the class's operations never follow each
     * other neither way can be (choice_record), and the class stays so. A try starts afresh: one
     * whose samples were lost (another operation came in between) is dropped. */
    if (c->probe_left == 0 && c->ns_per_byte[0] != 0 && (!c->tried || ++c->since_probe >= CHOICE_PROBE_OPS) &&
        hccl_now_ns() - c->probed_ns >= gap_ns) {
        /* The first operations of the other way fault in pages the default way left alone
         * (grouped: the parts'): not timed either. */
        c->probe_skip = c->tried ? 0 : CHOICE_WARM_OPS;
        c->probe_left = CHOICE_PROBE_LEN + c->probe_skip;
        c->probe_n = 0;
        c->tried = true;
    }
    if (c->probe_left > 0) {
        if (--c->probe_left == 0) {
            c->since_probe = 0;
            c->probed_ns = hccl_now_ns();
        }
        *probe = true;
        return !best;
    }
    return best;
}

/* The word and figures of op's size class and kind. */
static int choice_index(const hccl_lane_op_t *op, size_t bytes)
{
    int cls = mode_class(bytes);

    if (op->coll == HCCL_COLL_ALLTOALL)
        return CHOICE_DIRECT_WORD0 + cls - CHOICE_DIRECT_CLASS0;
    return cls;
}

/*
 * Whether op takes the other way. Rank 0 writes, per size class and kind, one word: the way
 * from lseq "from" on, and the way before it; it rewrites it as it publishes each operation
 * of the class, for the next. A rank is never an operation ahead of rank 0's last
 * publication (it waits for rank 0's block), so every rank reads the same way for each lseq.
 */
static bool lane_choose_other(hccl_lane_t *lane, hccl_lane_op_t *op, size_t bytes)
{
    int idx = choice_index(op, bytes);
    uint64_t word = lane->win->word(lane->wctx, idx);
    bool other = op->lseq >= word >> 2 ? word & 1 : (word >> 1) & 1;

    if (lane->choice) {
        lane_choice_t *c = &lane->choice[idx];
        bool probe, next;
        op->probe = c->next_probe;
        next = choice_next(c, lane->limits.choice_ns ? lane->limits.choice_ns : CHOICE_PROBE_NS, &probe);
        c->next_probe = probe;
        lane->win->set_word(lane->wctx, idx, (op->lseq + 1) << 2 | (uint64_t)other << 1 | next);
    }
    return other;
}

/* The middle two of four, averaged: a try's figure, which one outlier does not move. */
static double median4(const double *v)
{
    double lo = v[0], hi = v[0], sum = 0;

    for (int i = 0; i < 4; i++) {
        sum += v[i];
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    return (sum - lo - hi) / 2;
}

/*
 * Rank 0, as it publishes op: the lane operation just before it, if of the same class, took
 * from its publication to op's. That includes whatever the caller did in between, the same for
 * both ways on average, but also the time until the other ranks were done with it, which the
 * time to its own result misses (a large part of it where ranks share CPUs:
 * docs/performance.md). An operation followed by another class, or by another kind of lane
 * operation, is not timed.
 */
static void choice_record(hccl_lane_t *lane, const hccl_lane_op_t *op, size_t bytes, int64_t now)
{
    lane_last_t *last = &lane->last;
    lane_choice_t *c = &lane->choice[choice_index(op, bytes)];
    double *f = &c->ns_per_byte[last->other], sample;

    if (!last->timed || last->lseq + 1 != op->lseq || last->coll != op->coll ||
        mode_class(last->bytes) != mode_class(bytes))
        return;
    sample = (double)(now - last->published_ns) / (double)last->bytes;
    if (last->probe && c->probe_skip > 0) {
        c->probe_skip--;
    } else if (last->probe) {
        c->probe[c->probe_n] = sample;
        if (++c->probe_n == CHOICE_PROBE_LEN) {
            *f = median4(c->probe);
            c->probe_n = 0;
        }
    } else if (last->warm) {
        /* A rare call takes many times the others (a rank that lost its turn on a shared
         * CPU): clipped to twice the figure, so that one does not swing the choice. */
        if (*f != 0 && sample > 2 * *f)
            sample = 2 * *f;
        *f = *f == 0 ? sample : *f + (sample - *f) / 8;
    }
}

hcclResult_t hccl_lane_choice_create(hccl_lane_t *lane)
{
    lane->choice = hccl_calloc(HCCL_WINDOW_WORDS, sizeof(*lane->choice));
    return lane->choice ? hcclSuccess : HCCL_FAIL(hcclSystemError, "lane: out of memory");
}

/* Whether op has two ways to choose from: grouped or not, copied or read. */
static bool lane_op_timed(const hccl_lane_t *lane, const hccl_lane_op_t *op, size_t bytes)
{
    if (op->coll == HCCL_COLL_ALLREDUCE)
        return op->split && lane->ngroups && bytes <= CHOICE_GROUPED_MAX;
    /* Only below direct_min: past it the read wins wherever it was measured, and a try of the
     * copy there costs its slot's first touch too (docs/performance.md). */
    return op->coll == HCCL_COLL_ALLTOALL && lane->limits.direct_choice_min &&
           bytes >= lane->limits.direct_choice_min && bytes < lane->limits.direct_min &&
           mode_class(bytes) >= CHOICE_DIRECT_CLASS0;
}

void hccl_lane_choose_way(hccl_lane_t *lane, hccl_lane_op_t *op, size_t bytes)
{
    op->timed = lane_op_timed(lane, op, bytes);
    if (op->timed) {
        int64_t now = lane->choice ? hccl_now_ns() : 0; /* rank 0 alone times */
        bool other;
        if (lane->choice)
            choice_record(lane, op, bytes, now);
        /* Tests may have every split AllReduce grouped (group_always). */
        other = (op->coll == HCCL_COLL_ALLREDUCE && lane->limits.group_always) ||
                lane_choose_other(lane, op, bytes);
        if (op->coll == HCCL_COLL_ALLREDUCE)
            op->grouped = other;
        else
            op->read_chosen = other;
        if (lane->choice)
            lane->last = (lane_last_t){.timed = true,
                                       .other = other,
                                       .probe = op->probe,
                                       .warm = lane->choice[choice_index(op, bytes)].decided >
                                               CHOICE_WARM_OPS,
                                       .coll = op->coll,
                                       .lseq = op->lseq,
                                       .bytes = bytes,
                                       .published_ns = now};
    } else if (lane->choice) {
        lane->last.timed = false; /* what follows it is not timed against it */
    }
}
