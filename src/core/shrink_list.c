/* hcclCommShrink's pure parts: argument checks, renumbering, agreement, the hello's decoder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/shrink.h"

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;

    return (x > y) - (x < y);
}

hcclResult_t hccl_shrink_list_check(int nranks, int rank, const int *list, int count, int *sorted)
{
    if (count < 0)
        return HCCL_FAIL(hcclInvalidArgument, "hcclCommShrink: excludeCount is %d (must be >= 0)",
                         count);
    if (count > 0 && !list)
        return HCCL_FAIL(hcclInvalidArgument,
                         "hcclCommShrink: excludeRanks is NULL with excludeCount %d", count);
    /* sorted holds nranks: a longer list repeats a rank, and must not be copied there. */
    if (count > nranks)
        return HCCL_FAIL(hcclInvalidArgument,
                         "hcclCommShrink: excludeCount %d exceeds the communicator's %d ranks",
                         count, nranks);
    for (int i = 0; i < count; i++)
        if (list[i] < 0 || list[i] >= nranks)
            return HCCL_FAIL(hcclInvalidArgument,
                             "hcclCommShrink: excludeRanks[%d] is %d, not a rank "
                             "of the communicator's %d",
                             i, list[i], nranks);
    if (count > 0)
        memcpy(sorted, list, (size_t)count * sizeof(*sorted));
    qsort(sorted, (size_t)count, sizeof(*sorted), cmp_int);
    for (int i = 1; i < count; i++)
        if (sorted[i] == sorted[i - 1])
            return HCCL_FAIL(hcclInvalidArgument,
                             "hcclCommShrink: rank %d is listed twice in excludeRanks", sorted[i]);
    for (int i = 0; i < count; i++)
        if (sorted[i] == rank)
            return HCCL_FAIL(hcclInvalidUsage,
                             "hcclCommShrink: rank %d excludes itself (only the "
                             "ranks that stay call hcclCommShrink)",
                             rank);
    return hcclSuccess;
}

int hccl_shrink_renumber(int nranks, const int *sorted, int count, int *new_of)
{
    int next = 0, k = 0;

    for (int r = 0; r < nranks; r++) {
        if (k < count && sorted[k] == r) {
            new_of[r] = -1;
            k++;
        } else {
            new_of[r] = next++;
        }
    }
    return next;
}

void hccl_shrink_list_text(const int *list, int count, char *buf, size_t len)
{
    size_t o = 0;

    if (len == 0)
        return;
    snprintf(buf, len, "%s", count ? "" : "none");
    for (int i = 0; i < count; i++) {
        char item[16];
        int n = snprintf(item, sizeof(item), "%s%d", i ? "," : "", list[i]);
        if (o + (size_t)n + 4 > len) {
            snprintf(buf + o, len - o, "...");
            return;
        }
        memcpy(buf + o, item, (size_t)n + 1);
        o += (size_t)n;
    }
}

hcclResult_t hccl_shrink_agree(int leader, const int *mine, int nmine, int rank, const int *theirs,
                               int ntheirs, char *why, size_t len)
{
    char a[128], b[128];
    bool same =
        nmine == ntheirs && (nmine == 0 || memcmp(mine, theirs, (size_t)nmine * sizeof(int)) == 0);
    bool excluded = false;

    for (int i = 0; i < nmine; i++)
        excluded |= mine[i] == rank;
    if (same && !excluded)
        return hcclSuccess;
    hccl_shrink_list_text(mine, nmine, a, sizeof(a));
    hccl_shrink_list_text(theirs, ntheirs, b, sizeof(b));
    if (excluded)
        snprintf(why, len,
                 "hcclCommShrink: rank %d takes part although rank %d excludes it: the "
                 "survivors disagree on the ranks to exclude: rank %d excludes %s, rank %d "
                 "excludes %s",
                 rank, leader, leader, a, rank, b);
    else
        snprintf(why, len,
                 "hcclCommShrink: the survivors disagree on the ranks to exclude: rank %d "
                 "excludes %s, rank %d excludes %s",
                 leader, a, rank, b);
    return hcclInvalidUsage;
}

bool hccl_shrink_list_valid(const int32_t *list, int nexclude, int nranks)
{
    for (int i = 0; i < nexclude; i++)
        if (list[i] < 0 || list[i] >= nranks || (i > 0 && list[i] <= list[i - 1]))
            return false;
    return true;
}

static bool terminated(char *s, size_t len)
{
    bool ok = memchr(s, '\0', len) != NULL;

    s[len - 1] = '\0';
    return ok;
}

const char *hccl_shrink_hello_check(hccl_shrink_hello_t *h, uint64_t comm_id, const uint8_t *secret,
                                    int nranks)
{
    /* The secret first, in constant time: nothing else is looked at for a stranger. */
    if (h->magic != HCCL_SHRINK_HELLO_MAGIC)
        return "not an hccl shrink hello";
    if (!hccl_secret_equal(h->secret, secret, HCCL_SECRET_BYTES))
        return "it did not present this communicator's secret";
    if (h->version != HCCL_SHRINK_VERSION)
        return "it speaks another shrink version (a different hccl build)";
    if (h->comm_id != comm_id || h->nranks != nranks)
        return "it shrinks another communicator";
    if (h->rank < 0 || h->rank >= nranks)
        return "rank out of range";
    if (h->status < hcclSuccess || h->status >= hcclNumResults || h->status == hcclInProgress)
        return "unknown status";
    if (h->nexclude < 0 || h->nexclude >= nranks)
        return "exclude list length out of range";
    terminated(h->errmsg, sizeof(h->errmsg));
    if (!terminated(h->config, sizeof(h->config)) && h->status == hcclSuccess)
        return "its settings are not terminated";
    if (!terminated(h->card.host, sizeof(h->card.host)) && h->status == hcclSuccess)
        return "its host identity is not terminated";
    return NULL;
}
