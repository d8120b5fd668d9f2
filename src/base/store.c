/*
 * Copies whose stores bypass the cache, for results larger than it: a plain store first reads
 * the line it writes (a read for ownership), and past the last-level cache that read goes to
 * memory, so streamed stores copy faster there (docs/performance.md). glibc's memcpy streams
 * too, but only from a size derived from the cache size the CPU reports, which a virtual
 * machine may report far above the real cache, beyond any message (hccl_topo_llc_bytes).
 */
#include <stdint.h>
#include <string.h>

#include "base/base.h"

#if defined(__x86_64__)
#include <emmintrin.h>

/* SSE2 is part of x86-64: no check at run time. 16-byte stores, 64 bytes per round. */
void hccl_store_copy(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;

    if (n < 256) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    /* Streaming stores are weakly ordered: they must be visible before whatever publishes them. */
    _mm_sfence();
    memcpy(d, s, n);
}

#else

void hccl_store_copy(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

#endif
