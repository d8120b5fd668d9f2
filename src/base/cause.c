/* The root cause of a failure: building, checking, ordering and rendering it (cause.h). */
#include <stdio.h>
#include <string.h>

#include "base/cause.h"

static int cause_set_limit(const hccl_cause_t *c)
{
    return c->nranks < HCCL_CAUSE_SET_RANKS ? c->nranks : HCCL_CAUSE_SET_RANKS;
}

bool hccl_cause_seen(const hccl_cause_t *c, int rank)
{
    if (rank < 0 || rank >= HCCL_CAUSE_SET_RANKS)
        return false;
    return (c->seen[rank / 64] >> (rank % 64)) & 1;
}

/* TIMEOUT: the origin is the first rank that had not posted the collective (none: the first
 * that had), so that it follows from the pooled set alone. */
static void cause_timeout_origin(hccl_cause_t *c)
{
    int lim = cause_set_limit(c);

    c->origin = -1;
    for (int r = 0; r < lim && c->origin < 0; r++)
        if (!hccl_cause_seen(c, r))
            c->origin = r;
    for (int r = 0; r < lim && c->origin < 0; r++)
        if (hccl_cause_seen(c, r))
            c->origin = r;
}

bool hccl_cause_see(hccl_cause_t *c, int rank)
{
    if (rank < 0 || rank >= HCCL_CAUSE_SET_RANKS || hccl_cause_seen(c, rank))
        return false;
    c->seen[rank / 64] |= 1ull << (rank % 64);
    if (c->kind == HCCL_CAUSE_TIMEOUT)
        cause_timeout_origin(c);
    return true;
}

static void cause_init(hccl_cause_t *c, int kind, hcclResult_t code, int origin, int nranks)
{
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    c->code = code;
    c->origin = origin;
    c->nranks = nranks;
}

void hccl_cause_text(hccl_cause_t *c, hcclResult_t code, int origin, int nranks, const char *text)
{
    cause_init(c, HCCL_CAUSE_TEXT, code, origin, nranks);
    snprintf(c->text, sizeof(c->text), "%s", text && text[0] ? text : hcclGetErrorString(code));
}

void hccl_cause_lost(hccl_cause_t *c, int origin, int seer, int nranks)
{
    cause_init(c, HCCL_CAUSE_LOST, hcclRemoteError, origin, nranks);
    hccl_cause_see(c, seer);
}

void hccl_cause_timeout(hccl_cause_t *c, uint64_t seq, const char *what, int timeout_ms, int seer,
                        int nranks)
{
    cause_init(c, HCCL_CAUSE_TIMEOUT, hcclTimeout, -1, nranks);
    c->seq = seq;
    c->timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 0;
    snprintf(c->text, sizeof(c->text), "%s", what);
    hccl_cause_see(c, seer);
}

bool hccl_cause_accept(hccl_cause_t *c, int nranks, const char **why)
{
    int lim;

    c->text[sizeof(c->text) - 1] = '\0';
    if (c->kind < HCCL_CAUSE_TEXT || c->kind > HCCL_CAUSE_LOST)
        *why = "unknown kind";
    else if (c->code <= hcclSuccess || c->code >= hcclNumResults || c->code == hcclInProgress)
        *why = "result code out of range";
    else if (c->flags & ~HCCL_CAUSE_FINAL)
        *why = "unknown flags";
    else if (c->nranks != nranks)
        *why = "rank count differs";
    else if (c->origin < -1 || c->origin >= nranks ||
             (c->kind != HCCL_CAUSE_TIMEOUT && c->origin < 0))
        *why = "origin rank out of range";
    else
        *why = NULL;
    if (*why)
        return false;
    /* Bits past the rank count would name ranks that do not exist. */
    lim = cause_set_limit(c);
    for (int r = lim; r < HCCL_CAUSE_SET_RANKS; r++)
        c->seen[r / 64] &= ~(1ull << (r % 64));
    if (c->kind == HCCL_CAUSE_TIMEOUT)
        cause_timeout_origin(c);
    return true;
}

/* Lower goes first: a mismatch is what the others' errors follow from; a timeout's pooled
 * view names the late rank; a rank gone without a goodbye is weak, since every rank that closes
 * after a failure looks like one to a peer that missed its goodbye; a bare remote error is the
 * weakest. */
static int cause_rank(const hccl_cause_t *c)
{
    if (c->kind == HCCL_CAUSE_TEXT && c->code == hcclInvalidUsage)
        return 0;
    if (c->kind == HCCL_CAUSE_TIMEOUT)
        return 1;
    if (c->kind == HCCL_CAUSE_TEXT && c->code != hcclRemoteError)
        return 2;
    /* A remote error that names no origin of its own is weaker than a peer known gone. */
    return c->kind == HCCL_CAUSE_LOST ? 3 : 4;
}

/* <0: a goes first; >0: b does; 0: the same cause (its sightings pool). */
static int cause_compare(const hccl_cause_t *a, const hccl_cause_t *b)
{
    int ra = cause_rank(a), rb = cause_rank(b);

    if (ra != rb)
        return ra - rb;
    if (a->kind == HCCL_CAUSE_TIMEOUT) {
        if (a->seq != b->seq)
            return a->seq < b->seq ? -1 : 1;
        return 0;
    }
    if (a->origin != b->origin)
        return a->origin - b->origin;
    /* Two texts of one origin: the origin sends only its first, but order them anyway. */
    return a->kind == HCCL_CAUSE_TEXT ? strcmp(a->text, b->text) : 0;
}

bool hccl_cause_merge(hccl_cause_t *cur, const hccl_cause_t *in)
{
    bool changed = false;
    int cmp;

    if (in->kind == HCCL_CAUSE_NONE)
        return false;
    if (cur->kind == HCCL_CAUSE_NONE) {
        *cur = *in;
        return true;
    }
    cmp = cause_compare(in, cur);
    if (cmp < 0) {
        *cur = *in;
        return true;
    }
    if (cmp > 0)
        return false;
    for (int r = 0; r < cause_set_limit(cur); r++)
        if (hccl_cause_seen(in, r))
            changed |= hccl_cause_see(cur, r);
    return changed;
}

/* "0,1,3" for the ranks in (want) or out of (!want) the set. */
static void cause_list(const hccl_cause_t *c, bool want, char *buf, size_t len)
{
    size_t o = 0;
    int lim = cause_set_limit(c);

    buf[0] = '\0';
    for (int r = 0; r < lim && o + 16 < len; r++)
        if (hccl_cause_seen(c, r) == want)
            o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", r);
    if (lim < c->nranks && o + 8 < len)
        snprintf(buf + o, len - o, "%s...", o ? "," : "");
}

void hccl_cause_render(const hccl_cause_t *c, char *buf, size_t len)
{
    char seen[256], missing[256];

    cause_list(c, true, seen, sizeof(seen));
    cause_list(c, false, missing, sizeof(missing));
    switch (c->kind) {
    case HCCL_CAUSE_TIMEOUT:
        if (missing[0])
            snprintf(buf, len,
                     "root cause at rank %d: rank%s %s did not take part in %s within the exec "
                     "timeout of %u ms (seen by ranks %s, which had joined it)",
                     c->origin, strchr(missing, ',') ? "s" : "", missing, c->text, c->timeout_ms,
                     seen);
        else
            snprintf(buf, len,
                     "root cause at rank %d: %s did not finish within the exec timeout of %u ms on "
                     "any rank (every rank had joined it)",
                     c->origin, c->text, c->timeout_ms);
        break;
    case HCCL_CAUSE_LOST:
        /* Not who saw it: ranks that read the connection late would each list others. */
        snprintf(buf, len,
                 "root cause at rank %d: rank %d went away without a goodbye (its process died or "
                 "its connections were cut)",
                 c->origin, c->origin);
        break;
    case HCCL_CAUSE_TEXT:
        snprintf(buf, len, "root cause at rank %d: %s", c->origin, c->text);
        break;
    default:
        snprintf(buf, len, "%s", "");
    }
}

void hccl_cause_adopt_final(hccl_cause_t *cur, const hccl_cause_t *in)
{
    if (cur->kind == HCCL_CAUSE_NONE || cause_compare(in, cur) <= 0)
        *cur = *in;
}
