/*
 * hccl-run's view of each rank's stdout and stderr with --tag-output: one
 * pipe per stream, read by the supervision loop, written out line by line
 * with the rank's tag. It also notices the last line of a state report.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hccl-run.h"

#define RUN_LINE_MAX        (32 * 1024) /* longer lines are split, each piece tagged */
#define RUN_TAG_MAX         16          /* "[65535]: " */
/* The library's last line of a SIGUSR1 state report (src/core/dump.c). */
#define RUN_DUMP_END        "state dump: end of report"

int stream_open(struct run_stream *s, int out_fd, int *write_end_p)
{
    int p[2];

    s->buf = malloc(RUN_LINE_MAX);
    if (s->buf == NULL || pipe2(p, O_CLOEXEC) != 0)
        return -1;
    /* Non-blocking so the final drain stops at "nothing more" instead of waiting. */
    if (fcntl(p[0], F_SETFL, O_NONBLOCK) != 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    s->fd = p[0];
    s->out_fd = out_fd;
    *write_end_p = p[1];
    return 0;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = { .fd = fd, .events = POLLOUT };
            poll(&pfd, 1, -1); /* our stdout was left non-blocking by someone */
            continue;
        }
        if (w < 0)
            return; /* EPIPE and the like: nobody reads, drop the output */
        p += w;
        n -= (size_t)w;
    }
}

/*
 * One write per line, prefix included, so lines never interleave mid-line.
 * The stream functions take the rank to tag with: the global one.
 */
static void stream_emit(const struct run_stream *s, int rank, const char *line, size_t n,
                        bool add_newline)
{
    char out[RUN_TAG_MAX + RUN_LINE_MAX + 1];
    int k = snprintf(out, RUN_TAG_MAX, "[%d]: ", rank);
    size_t len = (size_t)k;

    memcpy(out + len, line, n);
    len += n;
    if (add_newline)
        out[len++] = '\n';
    write_all(s->out_fd, out, len);
}

static void stream_emit_lines(struct run_stream *s, int rank)
{
    size_t start = 0;
    char *nl;

    while ((nl = memchr(s->buf + start, '\n', s->len - start)) != NULL) {
        size_t end = (size_t)(nl - s->buf) + 1;

        if (memmem(s->buf + start, end - start, RUN_DUMP_END, strlen(RUN_DUMP_END)) != NULL)
            s->dump_done = true;
        stream_emit(s, rank, s->buf + start, end - start, false);
        start = end;
    }
    if (start == 0 && s->len == RUN_LINE_MAX) {
        stream_emit(s, rank, s->buf, s->len, true); /* an overlong line, split */
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void stream_close(struct run_stream *s, int rank)
{
    if (s->len > 0)
        stream_emit(s, rank, s->buf, s->len, true); /* last line had no newline */
    s->len = 0;
    close(s->fd);
    s->fd = -1;
}

/*
 * Reads once, or until the pipe is empty with drain set (the writer is known
 * dead). One read per wake-up otherwise, so one chatty rank cannot starve
 * the loop.
 */
void stream_read(struct run_stream *s, int rank, bool drain)
{
    while (s->fd >= 0) {
        ssize_t n = read(s->fd, s->buf + s->len, RUN_LINE_MAX - s->len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            stream_close(s, rank);
            return;
        }
        s->len += (size_t)n;
        stream_emit_lines(s, rank);
        if (!drain)
            return;
    }
}

void drain_rank(struct launcher *l, int rank)
{
    if (!l->opts.tag_output)
        return;
    stream_read(&l->ranks[rank].out, global_rank(l, rank), true);
    stream_read(&l->ranks[rank].err, global_rank(l, rank), true);
}

/* Everyone who could write has exited: take what is buffered and close. */
void close_streams(struct launcher *l)
{
    for (int i = 0; i < l->opts.nranks && l->opts.tag_output; i++) {
        struct run_rank *r = &l->ranks[i];

        drain_rank(l, i);
        if (r->out.fd >= 0)
            stream_close(&r->out, global_rank(l, i));
        if (r->err.fd >= 0)
            stream_close(&r->err, global_rank(l, i));
    }
}
