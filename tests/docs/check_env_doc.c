/*
 * check_env_doc: docs/env.md against the code.
 *
 *   check_env_doc DOCS_ENV_MD SOURCE_ROOT
 *
 * Fails, naming each problem, when
 *   - a variable of the parameter table (src/base/param.c, hccl_param_at) has no row in the
 *     "## Variables" table of docs/env.md, or a row names a variable the table lacks;
 *   - a row's default differs from the table's, or the table's default from what the code does
 *     with the variable unset (hccl_params_load, the log settings, hccl-run's grace period);
 *   - a row's "same on all ranks" cell says "yes, checked at init" for a setting the rendezvous
 *     does not compare at init (hccl_config_describe), or does not for one it compares;
 *   - a source file under src/ or tools/ reads an HCCL_* variable the table lacks, or no source
 *     file reads one the table has (but for those in not_read, with the reason).
 * A default the check cannot observe from here is listed in read_elsewhere with the reason.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "core/wire.h"

extern char **environ;

/* Defaults that are not in hccl_params_load and cannot be observed from this program. */
static const struct {
    const char *name;
    const char *why;
} read_elsewhere[] = {
    {"HCCL_DEBUG_FILE", "base/log.c: unset, the log goes to stderr"},
    {"HCCL_COMM_ID", "core/comm.c (hcclCommInitFromEnv, hcclCommInitGroup): no default"},
    {"HCCL_COMM_SECRET",
     "core/comm.c (hcclCommInitGroup): unset, the rendezvous is not authenticated"},
    {"HCCL_RANK_TABLE", "not supported: setting it only warns"},
    {"HCCL_FAULT", "core/fault.c: unset, no fault"},
    {"HCCL_REDUCE_ISA", "sched/reduce.c: unset, the best kernels the CPU has"},
    {"HCCL_IB_HCA", "links/rdma/rdma_dev.c: unset, every device"},
    {"HCCL_IB_GID_INDEX", "links/rdma/rdma_dev.c: -1, the port's first IPv4-mapped GID"},
};

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fputs("check_env_doc: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    failures++;
}

static const hccl_param_info_t *param_find(const char *name)
{
    for (size_t i = 0; i < hccl_param_count(); i++)
        if (strcmp(hccl_param_at(i)->name, name) == 0)
            return hccl_param_at(i);
    return NULL;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

/* ---- what the code does with the variable unset ---- */

static void put_size(char *out, size_t len, size_t v, const char *max_word)
{
    if (v == SIZE_MAX)
        snprintf(out, len, "%s", max_word);
    else
        snprintf(out, len, "%zu", v);
}

static void put_str(char *out, size_t len, const char *v, const char *empty_word)
{
    snprintf(out, len, "%s", v[0] ? v : empty_word);
}

/* The default as the code has it, in the table's words; false if not observable here. */
static bool effective_default(const char *name, const hccl_params_t *p, const char *src_root,
                              char *out, size_t len)
{
    static const char *const levels[] = {"NONE", "WARN", "INFO", "TRACE"};

    if (strcmp(name, "HCCL_CONNECT_TIMEOUT") == 0)
        snprintf(out, len, "%d", p->connect_timeout_ms / 1000);
    else if (strcmp(name, "HCCL_EXEC_TIMEOUT") == 0)
        snprintf(out, len, "%d", p->exec_timeout_ms / 1000);
    else if (strcmp(name, "HCCL_BUFFSIZE") == 0)
        put_size(out, len, p->buffsize, "?");
    else if (strcmp(name, "HCCL_NSOCKS") == 0)
        snprintf(out, len, "%d", p->nsocks);
    else if (strcmp(name, "HCCL_CHECK") == 0)
        snprintf(out, len, "%d", p->check);
    else if (strcmp(name, "HCCL_CALIBRATE") == 0)
        snprintf(out, len, "%d", p->calibrate);
    else if (strcmp(name, "HCCL_DUMP_ON_SIGNAL") == 0)
        snprintf(out, len, "%d", p->dump_on_signal);
    else if (strcmp(name, "HCCL_RECV_REDUCE") == 0)
        snprintf(out, len, "%d", (int)p->recv_reduce);
    else if (strcmp(name, "HCCL_SPIN_US") == 0)
        snprintf(out, len, "%d", p->spin_us);
    else if (strcmp(name, "HCCL_CMA_THRESHOLD") == 0)
        put_size(out, len, p->cma_threshold, "?");
    else if (strcmp(name, "HCCL_SHM_PULL_MAX") == 0)
        put_size(out, len, p->shm_pull_max, "?");
    else if (strcmp(name, "HCCL_TCP_OFFER_MIN") == 0)
        put_size(out, len, p->tcp_offer_min, "0");
    else if (strcmp(name, "HCCL_LANE_MAX") == 0)
        put_size(out, len, p->lane_max, "auto");
    else if (strcmp(name, "HCCL_STORE_MIN") == 0)
        put_size(out, len, p->store_min, "auto");
    else if (strcmp(name, "HCCL_ALGO") == 0)
        put_str(out, len, p->algo, "auto");
    else if (strcmp(name, "HCCL_LINKS") == 0)
        put_str(out, len, p->links, "all");
    else if (strcmp(name, "HCCL_SOCKET_IFNAME") == 0)
        put_str(out, len, p->ifname, "auto");
    else if (strcmp(name, "HCCL_HOST_ID") == 0)
        put_str(out, len, p->host_id, "auto");
    else if (strcmp(name, "HCCL_COST_MODEL") == 0)
        put_str(out, len, p->cost_model, "auto");
    else if (strcmp(name, "HCCL_TOPO_DUMP") == 0)
        put_str(out, len, p->topo_dump, "none");
    else if (strcmp(name, "HCCL_DEBUG") == 0)
        snprintf(out, len, "%s",
                 hccl_log_level >= 0 && hccl_log_level <= 3 ? levels[hccl_log_level] : "?");
    else if (strcmp(name, "HCCL_DEBUG_SUBSYS") == 0)
        snprintf(out, len, "%s", hccl_log_subsys == HCCL_SUB_ALL ? "ALL" : "(a subset)");
    else if (strcmp(name, "HCCL_RUN_GRACE_S") == 0) {
        /* hccl-run is not in the library: its #define. */
        char path[4096], *text, *at;
        snprintf(path, sizeof(path), "%s/tools/hccl-run/opts.c", src_root);
        text = read_text(path);
        at = text ? strstr(text, "#define RUN_DEFAULT_GRACE_S") : NULL;
        if (!at) {
            free(text);
            snprintf(out, len, "(no RUN_DEFAULT_GRACE_S in tools/hccl-run/opts.c)");
            return true;
        }
        snprintf(out, len, "%g", strtod(at + strlen("#define RUN_DEFAULT_GRACE_S"), NULL));
        free(text);
    } else
        return false;
    return true;
}

static void check_table_defaults(const hccl_params_t *p, const char *src_root)
{
    for (size_t i = 0; i < hccl_param_count(); i++) {
        const hccl_param_info_t *v = hccl_param_at(i);
        char got[256];
        bool elsewhere = false;

        for (size_t k = 0; k < sizeof(read_elsewhere) / sizeof(read_elsewhere[0]); k++)
            elsewhere |= strcmp(read_elsewhere[k].name, v->name) == 0;
        if (effective_default(v->name, p, src_root, got, sizeof(got))) {
            if (strcmp(got, v->def) != 0)
                fail("src/base/param.c: the table says %s defaults to '%s', but with it unset the "
                     "code uses '%s'",
                     v->name, v->def, got);
        } else if (elsewhere) {
            for (size_t k = 0; k < sizeof(read_elsewhere) / sizeof(read_elsewhere[0]); k++)
                if (strcmp(read_elsewhere[k].name, v->name) == 0)
                    printf("check_env_doc: note: %s's default '%s' is not observed here (%s)\n",
                           v->name, v->def, read_elsewhere[k].why);
        } else {
            fail("%s: no check of its default; add it to effective_default or read_elsewhere in "
                 "tests/docs/check_env_doc.c",
                 v->name);
        }
    }
}

/* ---- docs/env.md ---- */

/* The cells of a markdown table row, trimmed, in place; returns how many. */
static int split_row(char *line, char **cells, int max)
{
    int n = 0;
    char *p = line;

    while (isspace((unsigned char)*p))
        p++;
    if (*p != '|')
        return 0;
    p++;
    while (*p && n < max) {
        char *end = strchr(p, '|');
        char *e;
        if (!end)
            break;
        *end = '\0';
        while (isspace((unsigned char)*p))
            p++;
        e = p + strlen(p);
        while (e > p && isspace((unsigned char)e[-1]))
            *--e = '\0';
        cells[n++] = p;
        p = end + 1;
    }
    return n;
}

/* The first `quoted` token of cell, else the whole cell, into out. */
static void cell_value(const char *cell, char *out, size_t len)
{
    const char *a = strchr(cell, '`');
    const char *b = a ? strchr(a + 1, '`') : NULL;

    if (a && b)
        snprintf(out, len, "%.*s", (int)(b - a - 1), a + 1);
    else
        snprintf(out, len, "%s", cell);
}

static bool config_compares(const char *config, const char *name)
{
    size_t n = strlen(name);

    for (const char *l = config; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, name, n) == 0 && l[n] == '=')
            return true;
    return false;
}

static void check_doc(const char *path, const char *config)
{
    char *text = read_text(path);
    bool *seen = calloc(hccl_param_count(), sizeof(bool));
    bool in_section = false, found_section = false;
    int lineno = 0, rows = 0;

    if (!text || !seen) {
        fail("cannot read %s", path);
        free(text);
        free(seen);
        return;
    }
    for (char *line = text, *next; line && *line; line = next) {
        char *cells[8], name[128], def[256];
        const hccl_param_info_t *v;
        int n;

        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        if (strncmp(line, "## ", 3) == 0) {
            in_section = strcmp(line, "## Variables") == 0;
            found_section |= in_section;
            continue;
        }
        if (!in_section || (n = split_row(line, cells, 8)) == 0)
            continue;
        cell_value(cells[0], name, sizeof(name));
        if (strncmp(name, "HCCL_", 5) != 0)
            continue; /* the header and separator rows */
        rows++;
        if (n < 4) {
            fail("%s:%d: %s: the row needs 4 cells (variable, default, same on all ranks, meaning)",
                 path, lineno, name);
            continue;
        }
        v = param_find(name);
        if (!v) {
            fail("%s:%d: %s is not a variable hccl reads (it is not in the table in "
                 "src/base/param.c): remove the row or add the variable there",
                 path, lineno, name);
            continue;
        }
        if (seen[v - hccl_param_at(0)])
            fail("%s:%d: %s has a second row", path, lineno, name);
        seen[v - hccl_param_at(0)] = true;
        cell_value(cells[1], def, sizeof(def));
        if (strcmp(def, v->def) != 0)
            fail("%s:%d: %s: the doc says the default is '%s', the code's is '%s'", path, lineno,
                 name, def, v->def);
        /* "yes, checked at init" exactly for what the rendezvous compares. */
        bool doc_checked = strncmp(cells[2], "yes, checked", 12) == 0;
        if (strncmp(cells[2], "yes", 3) != 0 && strncmp(cells[2], "no", 2) != 0)
            fail("%s:%d: %s: 'same on all ranks' must start with yes or no, not '%s'", path, lineno,
                 name, cells[2]);
        else if (doc_checked != config_compares(config, name))
            fail("%s:%d: %s: the doc says it is %schecked at init, but the init comparison "
                 "(hccl_config_describe in src/core/wire.c) %s it: the cell should %s",
                 path, lineno, name, doc_checked ? "" : "not ",
                 doc_checked ? "does not compare" : "compares",
                 doc_checked ? "not say 'yes, checked'" : "start with 'yes, checked at init'");
    }
    if (!found_section)
        fail("%s: no '## Variables' section", path);
    else if (rows == 0)
        fail("%s: the '## Variables' section has no rows", path);
    for (size_t i = 0; i < hccl_param_count(); i++)
        if (!seen[i])
            fail("%s: no row for %s (default '%s': %s)", path, hccl_param_at(i)->name,
                 hccl_param_at(i)->def, hccl_param_at(i)->doc);
    free(seen);
    free(text);
}

/* ---- the sources: every HCCL_* variable read must be in the table, and every one in it read ----
 */

/* In the table but read nowhere, and why. */
static const struct {
    const char *name;
    const char *why;
} not_read[] = {
    {"HCCL_RANK_TABLE", "not supported: base/param.c only warns when it is set"},
};

static bool *read_somewhere; /* per table entry */

static void scan_file(const char *path, const char *shown)
{
    static const char *const readers[] = {"getenv(\"", "hccl_param_env_long(\"", "env_string(\"",
                                          "env_int(\""};
    char *text = read_text(path);

    if (!text)
        return;
    for (size_t r = 0; r < sizeof(readers) / sizeof(readers[0]); r++) {
        for (const char *p = strstr(text, readers[r]); p; p = strstr(p + 1, readers[r])) {
            const char *name = p + strlen(readers[r]);
            size_t n = strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
            char buf[128];
            int line = 1;
            if (n < 6 || n >= sizeof(buf) || strncmp(name, "HCCL_", 5) != 0 || name[n] != '"')
                continue;
            memcpy(buf, name, n);
            buf[n] = '\0';
            if (param_find(buf)) {
                read_somewhere[param_find(buf) - hccl_param_at(0)] = true;
                continue;
            }
            for (const char *q = text; q < p; q++)
                line += *q == '\n';
            fail("%s:%d reads %s, which the table in src/base/param.c lacks (add it there and to "
                 "docs/env.md)",
                 shown, line, buf);
        }
    }
    free(text);
}

static void scan_dir(const char *root, const char *rel)
{
    char path[4096];
    DIR *d;
    struct dirent *e;

    snprintf(path, sizeof(path), "%s/%s", root, rel);
    if (!(d = opendir(path)))
        return;
    while ((e = readdir(d))) {
        char sub[2048], full[6144];
        struct stat st;
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", rel, e->d_name);
        snprintf(full, sizeof(full), "%s/%s", root, sub);
        if (stat(full, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            scan_dir(root, sub);
        else if (n > 2 &&
                 (strcmp(e->d_name + n - 2, ".c") == 0 || strcmp(e->d_name + n - 2, ".h") == 0))
            scan_file(full, sub);
    }
    closedir(d);
}

int main(int argc, char **argv)
{
    hccl_params_t p;
    char config[HCCL_CONFIG_TEXT_BYTES];

    if (argc != 3) {
        fprintf(stderr, "usage: %s DOCS_ENV_MD SOURCE_ROOT\n", argv[0]);
        return 2;
    }
    /* Every default as the code has it: no HCCL_* variable set. */
    for (;;) {
        char name[256];
        char **e = environ;
        while (*e && strncmp(*e, "HCCL_", 5) != 0)
            e++;
        if (!*e)
            break;
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(*e, "="), *e);
        unsetenv(name);
    }
    if (hccl_params_load(&p, NULL) != hcclSuccess) {
        printf("check_env_doc: hccl_params_load failed: %s\n", hccl_error_last());
        return 1;
    }
    hccl_config_describe(&p, config, sizeof(config));
    check_table_defaults(&p, argv[2]);
    check_doc(argv[1], config);
    read_somewhere = calloc(hccl_param_count(), sizeof(bool));
    if (!read_somewhere)
        return 1;
    scan_dir(argv[2], "src");
    scan_dir(argv[2], "tools");
    for (size_t i = 0; i < hccl_param_count(); i++) {
        bool excused = false;
        for (size_t k = 0; k < sizeof(not_read) / sizeof(not_read[0]); k++)
            excused |= strcmp(not_read[k].name, hccl_param_at(i)->name) == 0;
        if (!read_somewhere[i] && !excused)
            fail(
                "%s is in the table in src/base/param.c, but no file under src/ or tools/ reads it "
                "(getenv, hccl_param_env_long, env_string): remove it from the table and "
                "docs/env.md, or add it to not_read in tests/docs/check_env_doc.c with the reason",
                hccl_param_at(i)->name);
    }
    free(read_somewhere);
    if (failures) {
        printf("check_env_doc: %d problem%s: docs/env.md and src/base/param.c must agree\n",
               failures, failures == 1 ? "" : "s");
        return 1;
    }
    printf("check_env_doc: docs/env.md matches the code (%zu variables)\n", hccl_param_count());
    return 0;
}
