/* hccl-run's command line and HCCL_RUN_GRACE_S: parsing, validation, help text. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hccl-run.h"

#define RUN_DEFAULT_GRACE_S 3.0         /* a rank failed -> the others may exit on their own */
#define RUN_MAX_RANKS       65536

static const char usage_text[] =
    "usage: hccl-run -n N [--world-size W [--rank-offset K]] [--comm-id HOST:PORT]\n"
    "                [--timeout S] [--tag-output] [--] PROGRAM [ARGS...]\n"
    "Starts N ranks of PROGRAM on this host.\n"
    "  -n N               number of ranks started here (1 or more)\n"
    "  --world-size W     ranks in the whole job, over all hosts (default N)\n"
    "  --rank-offset K    global rank of the first rank started here (default 0;\n"
    "                     needs --world-size); K + N must not exceed W\n"
    "  --comm-id H:P      rendezvous address, set as HCCL_COMM_ID; rank 0's host\n"
    "                     must own H\n"
    "  --timeout S        stop all ranks after S seconds (fractions allowed); exit 124\n"
    "  --tag-output       prefix each line of output with \"[rank]: \" (global rank)\n"
    "  --bind core|auto|none  pin rank i to the i-th CPU this launcher may use, modulo\n"
    "                     their number (core, the default; auto: only when there is\n"
    "                     one for every rank)\n"
    "  -h, --help         show this text\n"
    "Rank i started here gets RANK_ID=RANK=K+i, LOCAL_RANK=i, WORLD_SIZE=W and\n"
    "LOCAL_WORLD_SIZE=N. Unless set already (or by --comm-id), HCCL_COMM_ID is\n"
    "127.0.0.1 and a free port, and then HCCL_SOCKET_IFNAME defaults to lo; with\n"
    "HCCL_COMM_ID given explicitly, HCCL_SOCKET_IFNAME is left alone (the\n"
    "library then picks the first non-loopback interface that is up; set it to\n"
    "the interface the hosts share). HCCL_COMM_SECRET, unless set, is random;\n"
    "a job over several hosts (W > N) needs --comm-id or HCCL_COMM_ID, and the\n"
    "same HCCL_COMM_SECRET set on every host (without one, the rendezvous is\n"
    "not authenticated). One hccl-run per host, for example:\n"
    "  host a: hccl-run -n 2 --world-size 4 --comm-id a:29500 ./prog\n"
    "  host b: hccl-run -n 2 --world-size 4 --rank-offset 2 --comm-id a:29500 ./prog\n"
    "When a rank fails, the others get HCCL_RUN_GRACE_S seconds (default 3) to\n"
    "exit before they are terminated. SIGINT, SIGTERM and SIGHUP are forwarded.\n"
    "At the timeout, ranks that catch SIGUSR1 (hccl does when HCCL_DUMP_ON_SIGNAL=1,\n"
    "which is set unless given) are first sent it and write what each of their\n"
    "requests waits for; they get up to " RUN_STR(RUN_DUMP_WAIT_S) " s for it.\n"
    "Exit status: 0 if every rank exited 0, 124 on timeout, 128+n after a\n"
    "forwarded signal n, 2 on bad usage, 1 otherwise.\n";

static bool parse_seconds(const char *s, bool allow_zero, double *out_p)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0 || (v == 0 && !allow_zero))
        return false;
    *out_p = v;
    return true;
}

/* A whole decimal number in [min, max]. */
static bool parse_int(const char *s, long min, long max, int *out_p)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
        return false;
    *out_p = (int)v;
    return true;
}

/* HOST:PORT or [V6HOST]:PORT; only the shape is checked, the library resolves it. */
static bool comm_id_is_valid(const char *s)
{
    const char *colon = strrchr(s, ':');
    int port;

    return colon != NULL && colon != s && parse_int(colon + 1, 1, 65535, &port);
}

/* The options that take a value, as "--opt V" or "--opt=V" (and "-nV"). */
static const char *const value_opts[] = {
    "-n", "--timeout", "--bind", "--world-size", "--rank-offset", "--comm-id",
};

/* Splits argv[*i] into option name and value; NULL if it is none of value_opts. */
static const char *split_value_opt(int argc, char **argv, int *i, const char **val_p)
{
    const char *a = argv[*i];

    for (size_t k = 0; k < sizeof(value_opts) / sizeof(value_opts[0]); k++) {
        const char *name = value_opts[k];
        size_t len = strlen(name);

        if (strcmp(a, name) == 0) {
            *val_p = *i + 1 < argc ? argv[++*i] : NULL;
            return name;
        }
        if (strncmp(a, name, len) == 0 && a[len] == '=' && name[1] == '-') {
            *val_p = a + len + 1;
            return name;
        }
    }
    if (strncmp(a, "-n", 2) == 0) {
        *val_p = a + 2; /* -n4 */
        return "-n";
    }
    return NULL;
}

/* Stores one option's value; false (message printed) if it is not valid. */
static bool set_value_opt(struct run_opts *o, const char *name, const char *val)
{
    if (strcmp(name, "-n") == 0) {
        if (parse_int(val, 1, RUN_MAX_RANKS, &o->nranks))
            return true;
        fprintf(stderr, "hccl-run: -n wants a rank count from 1 to %d, not '%s'\n", RUN_MAX_RANKS,
                val);
    } else if (strcmp(name, "--world-size") == 0) {
        if (parse_int(val, 1, RUN_MAX_RANKS, &o->world_size))
            return true;
        fprintf(stderr, "hccl-run: --world-size wants a rank count from 1 to %d, not '%s'\n",
                RUN_MAX_RANKS, val);
    } else if (strcmp(name, "--rank-offset") == 0) {
        if (parse_int(val, 0, RUN_MAX_RANKS - 1, &o->rank_offset))
            return true;
        fprintf(stderr, "hccl-run: --rank-offset wants a rank from 0 to %d, not '%s'\n",
                RUN_MAX_RANKS - 1, val);
    } else if (strcmp(name, "--bind") == 0) {
        o->bind = strcmp(val, "core") == 0 ? BIND_CORE : strcmp(val, "none") == 0 ? BIND_NONE
                  : strcmp(val, "auto") == 0 ? BIND_AUTO : -1;
        if (o->bind >= 0)
            return true;
        fprintf(stderr, "hccl-run: --bind wants auto, core or none, not '%s'\n", val);
    } else if (strcmp(name, "--comm-id") == 0) {
        o->comm_id = val;
        if (comm_id_is_valid(val))
            return true;
        fprintf(stderr, "hccl-run: --comm-id wants HOST:PORT, not '%s'\n", val);
    } else {
        if (parse_seconds(val, false, &o->timeout_s))
            return true;
        fprintf(stderr, "hccl-run: --timeout wants a positive number of seconds, not '%s'\n",
                val);
    }
    return false;
}

/* The options together; false (message printed) if they do not fit. */
static bool check_opts(struct run_opts *o, bool have_offset)
{
    if (o->nranks == 0) {
        fputs("hccl-run: -n N is required\n", stderr);
        return false;
    }
    if (have_offset && o->world_size == 0) {
        fputs("hccl-run: --rank-offset needs --world-size\n", stderr);
        return false;
    }
    if (o->world_size == 0)
        o->world_size = o->nranks;
    if ((long)o->rank_offset + o->nranks > o->world_size) {
        fprintf(stderr, "hccl-run: ranks %d to %d do not fit in a world of %d\n", o->rank_offset,
                o->rank_offset + o->nranks - 1, o->world_size);
        return false;
    }
    /* The other launchers could never find a port we make up. */
    if (o->world_size > o->nranks && o->comm_id == NULL && getenv("HCCL_COMM_ID") == NULL) {
        fputs("hccl-run: a job over several launchers (--world-size larger than -n) needs\n"
              "  --comm-id HOST:PORT or HCCL_COMM_ID, the same for all of them\n",
              stderr);
        return false;
    }
    return true;
}

int parse_args(int argc, char **argv, struct run_opts *o)
{
    bool have_offset = false;
    int i;

    o->bind = BIND_CORE;
    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        const char *name;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return 1;
        }
        if (strcmp(a, "--tag-output") == 0) {
            o->tag_output = true;
            continue;
        }
        name = split_value_opt(argc, argv, &i, &val);
        if (name == NULL) {
            fprintf(stderr, "hccl-run: unknown option %s\n", a);
            goto bad;
        }
        if (val == NULL) {
            fprintf(stderr, "hccl-run: %s needs a value\n", name);
            goto bad;
        }
        if (!set_value_opt(o, name, val))
            goto bad;
        if (strcmp(name, "--rank-offset") == 0)
            have_offset = true;
    }
    if (!check_opts(o, have_offset))
        goto bad;
    if (i >= argc) {
        fputs("hccl-run: no program given\n", stderr);
        goto bad;
    }
    o->argv = &argv[i];
    return 0;

bad:
    fputs(usage_text, stderr);
    return 2;
}

double grace_from_env(void)
{
    const char *s = getenv("HCCL_RUN_GRACE_S");
    double v;

    if (s == NULL)
        return RUN_DEFAULT_GRACE_S;
    if (!parse_seconds(s, true, &v)) {
        fprintf(stderr, "hccl-run: ignoring HCCL_RUN_GRACE_S='%s', using %g s\n", s,
                RUN_DEFAULT_GRACE_S);
        return RUN_DEFAULT_GRACE_S;
    }
    return v;
}
