/*
 * A rank's checks of the rendezvous' answer: the header (hccl_bs_reply_check), then either the
 * error text or the rank table (hccl_bs_cards_check) and the link cards in it, as the tcp and
 * shm links read them before connecting; and the link set-up's outcome or verdict that
 * crosses the same connection later (hccl_bs_setup_check).
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/wire.h"
#include "fuzz_common.h"
#include "links/shm/shm.h"
#include "links/tcp/tcp.h"

#define MAX_RANKS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    fuzz_in_t in = {data, size};
    hccl_bs_reply_t rep;
    hccl_card_t *cards;
    int nranks = fuzz_byte(&in) % MAX_RANKS + 1;
    int rank = fuzz_byte(&in) % nranks;
    size_t n;

    if (!quiet) {
        fuzz_quiet();
        quiet = true;
    }
    {
        hccl_bs_setup_t m;
        memset(&m, 0, sizeof(m));
        memcpy(&m, in.p, in.left < sizeof(m) ? in.left : sizeof(m));
        /* Accepted: its text fits the buffer the reader gives it, and its origin is a rank. */
        if (!hccl_bs_setup_check(&m, nranks) &&
            (m.msg_len > HCCL_BS_MAX_MSG || m.origin < 0 || m.origin >= nranks))
            abort();
    }
    memset(&rep, 0, sizeof(rep));
    n = in.left < sizeof(rep) ? in.left : sizeof(rep);
    memcpy(&rep, in.p, n);
    in.p += n;
    in.left -= n;
    if (hccl_bs_reply_check(&rep, rank, nranks) != hcclSuccess)
        return 0;
    if (rep.status != hcclSuccess) {
        char msg[HCCL_BS_MAX_MSG + 1];
        if (rep.msg_len > HCCL_BS_MAX_MSG)
            abort();
        n = in.left < rep.msg_len ? in.left : rep.msg_len;
        memcpy(msg, in.p, n);
        msg[n] = '\0';
        return 0;
    }
    cards = calloc((size_t)nranks, sizeof(*cards));
    memcpy(cards, in.p, in.left < nranks * sizeof(*cards) ? in.left : nranks * sizeof(*cards));
    if (hccl_bs_cards_check(cards, nranks, rank) == hcclSuccess) {
        for (int r = 0; r < nranks; r++) {
            const shm_card_t *sc = (const shm_card_t *)cards[r].blob[HCCL_LINK_SHM];
            if (strnlen(cards[r].host, sizeof(cards[r].host)) == sizeof(cards[r].host))
                abort();
            (void)hccl_tcp_card_check((const tcp_card_t *)cards[r].blob[HCCL_LINK_TCP]);
            if (!hccl_shm_card_check(sc, sc->ring_bytes) &&
                (strnlen(sc->seg, sizeof(sc->seg)) == sizeof(sc->seg) ||
                 strnlen(sc->uds, sizeof(sc->uds)) == sizeof(sc->uds)))
                abort();
        }
    }
    free(cards);
    return 0;
}
