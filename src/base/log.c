/* Logging to stderr (or HCCL_DEBUG_FILE), prefixed with host, pid and rank. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/base.h"

int hccl_log_level = HCCL_LOG_WARN;
unsigned hccl_log_subsys = HCCL_SUB_ALL;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static FILE *log_file;
static char log_host[64];
static const char *log_file_pattern;
static _Thread_local HCCL_TLS_FAST int log_rank = -1;

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"INIT", HCCL_SUB_INIT},   {"LINK", HCCL_SUB_LINK},       {"SCHED", HCCL_SUB_SCHED},
    {"ALGO", HCCL_SUB_ALGO},   {"REACTOR", HCCL_SUB_REACTOR}, {"ALL", HCCL_SUB_ALL},
};

static unsigned parse_subsys(const char *list)
{
    unsigned mask = 0;
    char buf[256];
    char *save = NULL;

    snprintf(buf, sizeof(buf), "%s", list);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        bool known = false;
        for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++) {
            if (strcasecmp(tok, subsys_names[i].name) == 0) {
                mask |= subsys_names[i].bit;
                known = true;
            }
        }
        if (!known)
            fprintf(stderr, "%s:%d:? hccl WARN HCCL_DEBUG_SUBSYS: unknown subsystem '%s'\n",
                    log_host, (int)getpid(), tok);
    }
    return mask ? mask : HCCL_SUB_ALL;
}

/* Expands %h, %p and %r in the HCCL_DEBUG_FILE pattern. */
static void expand_pattern(const char *pat, char *out, size_t len, int rank)
{
    size_t o = 0;

    for (const char *p = pat; *p && o + 1 < len; p++) {
        int n = 0;
        if (p[0] == '%' && p[1] == 'h')
            n = snprintf(out + o, len - o, "%s", log_host);
        else if (p[0] == '%' && p[1] == 'p')
            n = snprintf(out + o, len - o, "%d", (int)getpid());
        else if (p[0] == '%' && p[1] == 'r')
            n = snprintf(out + o, len - o, "%d", rank);
        else {
            out[o++] = *p;
            continue;
        }
        p++;
        o += (n > 0 && (size_t)n < len - o) ? (size_t)n : 0;
    }
    out[o] = '\0';
}

static void log_init_once(void)
{
    const char *lvl = getenv("HCCL_DEBUG");
    const char *sub = getenv("HCCL_DEBUG_SUBSYS");

    gethostname(log_host, sizeof(log_host) - 1);
    if (lvl && *lvl) {
        if (strcasecmp(lvl, "WARN") == 0)
            hccl_log_level = HCCL_LOG_WARN;
        else if (strcasecmp(lvl, "INFO") == 0)
            hccl_log_level = HCCL_LOG_INFO;
        else if (strcasecmp(lvl, "TRACE") == 0)
            hccl_log_level = HCCL_LOG_TRACE;
        else if (strcasecmp(lvl, "NONE") == 0 || strcasecmp(lvl, "OFF") == 0)
            hccl_log_level = HCCL_LOG_NONE;
        else
            fprintf(stderr, "%s:%d:? hccl WARN HCCL_DEBUG: unknown level '%s' (WARN, INFO, TRACE)\n",
                    log_host, (int)getpid(), lvl);
    }
    if (sub && *sub)
        hccl_log_subsys = parse_subsys(sub);
    log_file_pattern = getenv("HCCL_DEBUG_FILE");
}

void hccl_log_init(void)
{
    pthread_once(&log_once, log_init_once);
}

void hccl_log_set_rank(int rank)
{
    log_rank = rank;
}

static FILE *log_stream(void)
{
    static pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;

    if (!log_file_pattern || !*log_file_pattern)
        return stderr;
    pthread_mutex_lock(&mtx);
    if (!log_file) {
        char path[512];
        expand_pattern(log_file_pattern, path, sizeof(path), log_rank);
        log_file = fopen(path, "a");
        if (log_file)
            setvbuf(log_file, NULL, _IOLBF, 0);
    }
    pthread_mutex_unlock(&mtx);
    return log_file ? log_file : stderr;
}

void hccl_log_write(int level, unsigned sub, const char *fmt, ...)
{
    static const char *level_names[] = {"NONE", "WARN", "INFO", "TRACE"};
    int saved = errno;
    char msg[1536];
    struct timeval tv;
    va_list ap;

    (void)sub;
    hccl_log_init();
    if (level > hccl_log_level)
        goto out;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    gettimeofday(&tv, NULL);
    /* One fprintf per line so that lines from several threads do not mix. */
    fprintf(log_stream(), "%s:%d:%d %ld.%06ld hccl %s %s\n", log_host, (int)getpid(), log_rank,
            (long)tv.tv_sec, (long)tv.tv_usec, level_names[level], msg);
out:
    errno = saved;
}
