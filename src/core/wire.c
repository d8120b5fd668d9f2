/* Pure decoders of the bootstrap's wire and the config-consistency description (see wire.h). */
#include <stdio.h>
#include <string.h>

#include "core/wire.h"
#include "links/frame.h"

/* Forces a NUL into the last byte; true if the string already ended inside the field. */
static bool terminate(char *s, size_t len)
{
    bool ended = memchr(s, '\0', len) != NULL;

    s[len - 1] = '\0';
    return ended;
}

const char *hccl_bs_hello_check(hccl_bs_hello_t *h, const uint8_t *secret)
{
    /* The secret first, in constant time: nothing else is looked at for a stranger. */
    if (h->magic != HCCL_BS_HELLO_MAGIC)
        return "not an hccl bootstrap hello";
    if (!hccl_secret_equal(h->secret, secret, HCCL_SECRET_BYTES))
        return "it did not present this communicator's secret";
    if (h->version != HCCL_BS_VERSION)
        return "it speaks another bootstrap version (a different hccl build)";
    if (h->nranks < 1 || h->nranks > HCCL_BS_MAX_RANKS)
        return "communicator size out of range";
    if (h->rank < 0 || h->rank >= h->nranks)
        return "rank out of range";
    if (h->status < hcclSuccess || h->status >= hcclNumResults || h->status == hcclInProgress)
        return "unknown status";
    if (h->status == hcclSuccess && h->card.rank != (uint32_t)h->rank)
        return "its card names another rank";
    terminate(h->errmsg, sizeof(h->errmsg));
    if (!terminate(h->config, sizeof(h->config)) && h->status == hcclSuccess)
        return "its settings are not terminated";
    if (!terminate(h->card.host, sizeof(h->card.host)) && h->status == hcclSuccess)
        return "its host identity is not terminated";
    return NULL;
}

hcclResult_t hccl_bs_reply_check(const hccl_bs_reply_t *rep, int rank, int nranks)
{
    if (rep->magic != HCCL_BS_REPLY_MAGIC)
        return HCCL_FAIL(hcclRemoteError, "rank %d: the rendezvous answered with a malformed header", rank);
    if (rep->status < hcclSuccess || rep->status >= hcclNumResults || rep->status == hcclInProgress)
        return HCCL_FAIL(hcclRemoteError, "rank %d: the rendezvous answered with unknown status %d", rank,
                         rep->status);
    if (rep->status != hcclSuccess) {
        if (rep->msg_len > HCCL_BS_MAX_MSG)
            return HCCL_FAIL(hcclRemoteError, "rank %d: the rendezvous' error text claims %u bytes",
                             rank, rep->msg_len);
        return hcclSuccess;
    }
    if (rep->nranks != (uint32_t)nranks)
        return HCCL_FAIL(hcclRemoteError, "rank %d: the rendezvous answered for %u ranks, not %d", rank,
                         rep->nranks, nranks);
    if (rep->msg_len != 0)
        return HCCL_FAIL(hcclRemoteError, "rank %d: the rendezvous' answer carries %u bytes of text "
                                          "with success", rank, rep->msg_len);
    return hcclSuccess;
}

const char *hccl_bs_setup_check(const hccl_bs_setup_t *m, int nranks)
{
    if (m->magic != HCCL_BS_SETUP_MAGIC)
        return "a malformed header";
    if (m->status < hcclSuccess || m->status >= hcclNumResults || m->status == hcclInProgress)
        return "an unknown status";
    if (m->origin < 0 || m->origin >= nranks)
        return "an origin out of range";
    if (m->msg_len > HCCL_BS_MAX_MSG)
        return "a text longer than allowed";
    return NULL;
}

hcclResult_t hccl_bs_cards_check(hccl_card_t *cards, int nranks, int rank)
{
    for (int r = 0; r < nranks; r++) {
        hccl_card_t *c = &cards[r];
        if (c->rank != (uint32_t)r)
            return HCCL_FAIL(hcclRemoteError, "rank %d: malformed rank table: entry %d is rank %u", rank,
                             r, c->rank);
        if (c->links & ~((1u << HCCL_LINK_MAX) - 1))
            return HCCL_FAIL(hcclRemoteError, "rank %d: malformed rank table: rank %d offers unknown "
                                              "links 0x%x", rank, r, c->links);
        if (!terminate(c->host, sizeof(c->host)))
            return HCCL_FAIL(hcclRemoteError, "rank %d: malformed rank table: rank %d's host identity "
                                              "is not terminated", rank, r);
    }
    return hcclSuccess;
}

void hccl_config_describe(const hccl_params_t *p, char *out, size_t len)
{
    snprintf(out, len,
             "version=%d.%d.%d frames %d\n"
             "HCCL_ALGO=%s\n"
             "HCCL_BUFFSIZE=%zu\n"
             "HCCL_LINKS=%s\n"
             "HCCL_CHECK=%d\n"
             "HCCL_CALIBRATE=%d\n"
             "HCCL_COST_MODEL=%s\n"
             "HCCL_LANE_MAX=%zd\n",
             HCCL_MAJOR, HCCL_MINOR, HCCL_PATCH, HCCL_WIRE_VERSION, p->algo, p->buffsize, p->links,
             p->check, p->calibrate, p->cost_model, (ssize_t)p->lane_max);
}

/* The next "KEY=value" line of *s: key and value spans; false at the end. */
static bool next_line(const char **s, const char **key, size_t *klen, const char **val, size_t *vlen)
{
    const char *p = *s, *eq, *nl;

    while (*p == '\n')
        p++;
    if (!*p)
        return false;
    nl = strchr(p, '\n');
    if (!nl)
        nl = p + strlen(p);
    eq = memchr(p, '=', (size_t)(nl - p));
    *key = p;
    *klen = eq ? (size_t)(eq - p) : (size_t)(nl - p);
    *val = eq ? eq + 1 : nl;
    *vlen = (size_t)(nl - *val);
    *s = nl;
    return true;
}

/* The value of key in text, or NULL. */
static const char *find_key(const char *text, const char *key, size_t klen, size_t *vlen)
{
    const char *k, *v;
    size_t kl;

    while (next_line(&text, &k, &kl, &v, vlen))
        if (kl == klen && memcmp(k, key, klen) == 0)
            return v;
    return NULL;
}

/* Appends one difference; values are shown printable and bounded, they may come from anyone. */
static void diff_append(char *out, size_t len, size_t *o, const char *key, size_t klen, int ra,
                        const char *va, size_t vla, int rb, const char *vb, size_t vlb)
{
    const char *vals[2] = {va, vb};
    size_t vlens[2] = {vla, vlb};
    int ranks[2] = {ra, rb};
    char shown[2][80];

    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        if (!vals[i]) {
            snprintf(shown[i], sizeof(shown[i]), "(not set: another version)");
            continue;
        }
        shown[i][n++] = '\'';
        for (size_t j = 0; j < vlens[i] && n < sizeof(shown[i]) - 5; j++)
            shown[i][n++] = vals[i][j] >= 0x20 && vals[i][j] < 0x7f ? vals[i][j] : '?';
        if (vlens[i] > sizeof(shown[i]) - 6)
            shown[i][n++] = '~';
        shown[i][n++] = '\'';
        shown[i][n] = '\0';
    }
    if (*o + 1 >= len)
        return;
    *o += (size_t)snprintf(out + *o, len - *o, "%s%.*s: rank %d %s, rank %d %s", *o ? "; " : "",
                           (int)(klen > 40 ? 40 : klen), key, ranks[0], shown[0], ranks[1], shown[1]);
    if (*o >= len)
        *o = len - 1;
}

int hccl_config_diff(const char *a, int ra, const char *b, int rb, char *out, size_t len)
{
    const char *s = a, *k, *va, *vb;
    size_t kl, vla, vlb, o = 0;
    int n = 0;

    if (len)
        out[0] = '\0';
    while (next_line(&s, &k, &kl, &va, &vla)) {
        vb = find_key(b, k, kl, &vlb);
        if (vb && vla == vlb && memcmp(va, vb, vla) == 0)
            continue;
        n++;
        diff_append(out, len, &o, k, kl, ra, va, vla, rb, vb, vb ? vlb : 0);
    }
    s = b;
    while (next_line(&s, &k, &kl, &vb, &vlb)) {
        if (find_key(a, k, kl, &vla))
            continue;
        n++;
        diff_append(out, len, &o, k, kl, ra, NULL, 0, rb, vb, vlb);
    }
    return n;
}
