/* hccl-perf's options, test data, checking and report (perf_common.h). */
#include "perf_common.h"

const char *const coll_names[C_NCOLL] = {"allreduce", "broadcast",     "reduce",
                                         "allgather", "reducescatter", "alltoall"};

const dtype_info_t dtypes[] = {
    {"int8", "char", hcclInt8, 1},        {"uint8", "uchar", hcclUint8, 1},
    {"int32", "int", hcclInt32, 4},       {"uint32", "uint", hcclUint32, 4},
    {"int64", "long", hcclInt64, 8},      {"uint64", "ulong", hcclUint64, 8},
    {"half", "float16", hcclFloat16, 2},  {"bfloat16", "bf16", hcclBfloat16, 2},
    {"float", "float32", hcclFloat32, 4}, {"double", "float64", hcclFloat64, 8},
};

const char *const op_names[] = {"sum", "prod", "max", "min", "avg"};

double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);

    switch (*end) {
    case 'G':
    case 'g':
        v *= 1024; /* fall through */
    case 'M':
    case 'm':
        v *= 1024; /* fall through */
    case 'K':
    case 'k':
        v *= 1024;
        end++;
        break;
    default:
        break;
    }
    if (end == s || (*end && strcmp(end, "B") != 0 && strcmp(end, "b") != 0) || v < 0)
        return -1;
    *out = (size_t)v;
    return 0;
}

/* ---- element access: every dtype through double (the test values are small integers) ---- */

static uint16_t to_half(float f)
{
    union {
        float f;
        uint32_t u;
    } x = {f};
    uint32_t sign = (x.u >> 16) & 0x8000u, mant = x.u & 0x7fffffu;
    int exp = (int)((x.u >> 23) & 0xff) - 127 + 15;

    if (f == 0.0f)
        return (uint16_t)sign;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0)
        return (uint16_t)sign; /* the tool's values never get this small */
    /* round to nearest even on the 13 dropped bits */
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

static float from_half(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    union {
        uint32_t u;
        float f;
    } x;

    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    x.u = sign | (exp == 31 ? 0xff : exp - 15 + 127) << 23 | mant << 13;
    return x.f;
}

static uint16_t to_bf16(float f)
{
    union {
        float f;
        uint32_t u;
    } x = {f};
    return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t b)
{
    union {
        uint32_t u;
        float f;
    } x = {(uint32_t)b << 16};
    return x.f;
}

void put(void *buf, hcclDataType_t dt, size_t i, double v)
{
    switch (dt) {
    case hcclInt8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case hcclUint8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case hcclInt32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case hcclUint32:
        ((uint32_t *)buf)[i] = (uint32_t)v;
        break;
    case hcclInt64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case hcclUint64:
        ((uint64_t *)buf)[i] = (uint64_t)v;
        break;
    case hcclFloat16:
        ((uint16_t *)buf)[i] = to_half((float)v);
        break;
    case hcclBfloat16:
        ((uint16_t *)buf)[i] = to_bf16((float)v);
        break;
    case hcclFloat32:
        ((float *)buf)[i] = (float)v;
        break;
    default:
        ((double *)buf)[i] = v;
        break;
    }
}

double get(const void *buf, hcclDataType_t dt, size_t i)
{
    switch (dt) {
    case hcclInt8:
        return ((const int8_t *)buf)[i];
    case hcclUint8:
        return ((const uint8_t *)buf)[i];
    case hcclInt32:
        return ((const int32_t *)buf)[i];
    case hcclUint32:
        return ((const uint32_t *)buf)[i];
    case hcclInt64:
        return (double)((const int64_t *)buf)[i];
    case hcclUint64:
        return (double)((const uint64_t *)buf)[i];
    case hcclFloat16:
        return from_half(((const uint16_t *)buf)[i]);
    case hcclBfloat16:
        return from_bf16(((const uint16_t *)buf)[i]);
    case hcclFloat32:
        return ((const float *)buf)[i];
    default:
        return ((const double *)buf)[i];
    }
}

static int is_integer(hcclDataType_t dt)
{
    return dt != hcclFloat16 && dt != hcclBfloat16 && dt != hcclFloat32 && dt != hcclFloat64;
}

/*
 * Rank r's input element at global index i. Small integers, so that every
 * reduction over up to ~40 ranks is exact in every dtype; the product has one
 * factor 2 per element, so it is 2 whatever the rank count.
 */
double input_value(hcclRedOp_t op, int n, int r, size_t i)
{
    switch (op) {
    case hcclProd:
        return (r + i) % (size_t)n == 0 ? 2.0 : 1.0;
    case hcclMax:
    case hcclMin:
        return (double)((r + i) % 5);
    default:
        return (double)(1 + (r + i) % 3);
    }
}

static double reduced_value(hcclRedOp_t op, hcclDataType_t dt, int n, size_t i)
{
    double acc = input_value(op, n, 0, i);

    for (int r = 1; r < n; r++) {
        double v = input_value(op, n, r, i);
        switch (op) {
        case hcclProd:
            acc *= v;
            break;
        case hcclMax:
            acc = v > acc ? v : acc;
            break;
        case hcclMin:
            acc = v < acc ? v : acc;
            break;
        default:
            acc += v;
            break;
        }
    }
    if (op == hcclAvg)
        acc = is_integer(dt) ? floor(acc / n) : acc / n;
    return acc;
}

int expect_init(expect_t *e, const opts_t *o, int n)
{
    e->period = 15u * (size_t)n;
    e->v = malloc(e->period * sizeof(double));
    if (!e->v)
        return -1;
    for (size_t i = 0; i < e->period; i++)
        e->v[i] = reduced_value(o->op, o->dt->dtype, n, i);
    return 0;
}

long long count_wrong(const void *buf, hcclDataType_t dt, size_t count, size_t first,
                      const expect_t *e)
{
    double tol = dt == hcclFloat16    ? 1e-3
                 : dt == hcclBfloat16 ? 1e-2
                 : dt == hcclFloat32  ? 1e-6
                                      : 1e-12;
    long long wrong = 0;

    for (size_t i = 0; i < count; i++) {
        double want = e->v[(first + i) % e->period], got = get(buf, dt, i);
        if (!(fabs(got - want) <= tol * fabs(want)))
            wrong++;
    }
    return wrong;
}

/* Data-movement collectives: the value of element k of block b sent by rank r. */
double moved_value(int r, int b, size_t k)
{
    return (double)(((size_t)r * 7 + (size_t)b * 3 + k) % 11);
}

/* Sum (or max) of one double over the ranks. */
double across(perf_t *p, double v, hcclRedOp_t op)
{
    CHECK(hcclAllReduce(&v, &v, 1, hcclFloat64, op, p->comm));
    return v;
}

/* ---- output ---- */

void print_header(const perf_t *p, int coll)
{
    const opts_t *o = p->o;

    if (o->csv || o->json)
        return;
    printf("#\n# %s: %d ranks, %s %s, %s, %d in flight, %s\n", coll_names[coll], p->n, o->dt->name,
           op_names[o->op], o->blocking ? "blocking calls" : "async + wait", o->inflight,
           o->algo ? o->algo : "algorithm chosen by the tuner");
    if (o->time_budget > 0)
        printf("# iterations: %.2f s per size, warm-up %d\n", o->time_budget, o->warmup);
    else
        printf("# iterations: %d, warm-up %d\n", o->iters, o->warmup);
    printf("#\n# %10s %12s %8s %6s %5s  %-32s   %-32s\n", "", "", "", "", "", "out-of-place",
           "in-place");
    printf("# %10s %12s %8s %6s %5s  %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s %12s %8s %6s %5s  %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)", "(elements)", "",
           "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

int rooted(int coll)
{
    return coll == C_BROADCAST || coll == C_REDUCE;
}

int reducing(int coll)
{
    return coll == C_ALLREDUCE || coll == C_REDUCE || coll == C_REDUCESCATTER;
}

void emit_row(perf_t *p, int coll, int in_place, size_t bytes, size_t count, const result_t *r)
{
    const opts_t *o = p->o;
    const char *redop = reducing(coll) ? op_names[o->op] : "none";
    int root = rooted(coll) ? o->root : -1;

    if (o->csv) {
        printf("%s,%zu,%zu,%s,%s,%d,%s,%.3f,%.4f,%.4f,%lld,%d,%s\n", coll_names[coll], bytes, count,
               o->dt->name, redop, root, in_place ? "ip" : "oop", r->time_us, r->algbw, r->busbw,
               o->check ? r->wrong : -1LL, p->n, o->algo ? o->algo : "auto");
    } else if (o->json) {
        printf(
            "%s\n  {\"collective\": \"%s\", \"size\": %zu, \"count\": %zu, \"type\": \"%s\", "
            "\"redop\": \"%s\", \"root\": %d, \"placement\": \"%s\", \"time_us\": %.3f, "
            "\"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": %lld, \"nranks\": %d, \"algo\": \"%s\"}",
            p->json_rows++ ? "," : "", coll_names[coll], bytes, count, o->dt->name, redop, root,
            in_place ? "ip" : "oop", r->time_us, r->algbw, r->busbw, o->check ? r->wrong : -1LL,
            p->n, o->algo ? o->algo : "auto");
    }
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: hccl-perf [options]   (run it under hccl-run, mpirun, torchrun or srun)\n"
        "  -C, --coll NAME       allreduce|broadcast|reduce|allgather|reducescatter|alltoall|all\n"
        "                        (default allreduce)\n"
        "  -b, --minbytes SIZE   smallest size (default 8; K, M, G suffixes)\n"
        "  -e, --maxbytes SIZE   largest size (default 32M)\n"
        "  -f, --stepfactor F    multiply the size by F each step (default 2)\n"
        "  -i, --stepbytes SIZE  or add SIZE each step\n"
        "  -s, --sizes LIST      or exactly these sizes, e.g. 8,64K,1M,64M\n"
        "  -n, --iters N         timed iterations per size (default 20)\n"
        "  -w, --warmup_iters N  untimed iterations first (default 5)\n"
        "  -T, --time S          instead of -n: about S seconds of timed iterations per size\n"
        "  -c, --check 0|1       check the results (default 1)\n"
        "  -d, --datatype T      int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double\n"
        "                        (default float)\n"
        "  -o, --op OP           sum prod max min avg (default sum)\n"
        "  -r, --root R          root of broadcast and reduce (default 0)\n"
        "  -a, --algo A          force an algorithm (HCCL_ALGO syntax, e.g. ring or "
        "allreduce=tree)\n"
        "  -z, --blocking 0|1    1: blocking calls; 0: async then wait (default 0)\n"
        "  -N, --inflight N      collectives posted together before waiting (default 1, at most "
        "%d),\n"
        "                        each on its own buffers; with -z 1 they run one after another\n"
        "  -p, --placement P     oop, ip or both (default both)\n"
        "      --csv             machine-readable rows instead of the table\n"
        "      --json            a JSON array instead of the table\n"
        "  -h, --help\n"
        "size is in bytes as in nccl-tests: the whole buffer for allreduce, broadcast and reduce,\n"
        "the gathered output for allgather, the input for reducescatter, each rank's send buffer\n"
        "for alltoall. busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reducescatter,\n"
        "alltoall), 1 (broadcast, reduce).\n",
        PERF_MAX_INFLIGHT);
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);

    if (end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int lookup(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int parse_opts(int argc, char **argv, opts_t *o)
{
    static const struct option longs[] = {
        {"coll", 1, 0, 'C'},         {"minbytes", 1, 0, 'b'},  {"maxbytes", 1, 0, 'e'},
        {"stepfactor", 1, 0, 'f'},   {"stepbytes", 1, 0, 'i'}, {"iters", 1, 0, 'n'},
        {"warmup_iters", 1, 0, 'w'}, {"time", 1, 0, 'T'},      {"check", 1, 0, 'c'},
        {"datatype", 1, 0, 'd'},     {"op", 1, 0, 'o'},        {"root", 1, 0, 'r'},
        {"algo", 1, 0, 'a'},         {"blocking", 1, 0, 'z'},  {"inflight", 1, 0, 'N'},
        {"placement", 1, 0, 'p'},    {"csv", 0, 0, 1},         {"json", 0, 0, 2},
        {"sizes", 1, 0, 's'},        {"help", 0, 0, 'h'},      {0, 0, 0, 0}};
    int c, idx;
    char *end;

    *o = (opts_t){.colls = {C_ALLREDUCE},
                  .ncolls = 1,
                  .min_bytes = 8,
                  .max_bytes = 32u << 20,
                  .factor = 2,
                  .iters = 20,
                  .warmup = 5,
                  .check = 1,
                  .inflight = 1,
                  .dt = &dtypes[8],
                  .op = hcclSum,
                  .placements = 3};
    while ((c = getopt_long(argc, argv, "C:b:e:f:i:n:w:T:c:d:o:r:a:z:N:p:s:h", longs, &idx)) !=
           -1) {
        int bad = 0;
        switch (c) {
        case 'C':
            if (strcmp(optarg, "all") == 0) {
                for (int k = 0; k < C_NCOLL; k++)
                    o->colls[k] = k;
                o->ncolls = C_NCOLL;
            } else {
                o->colls[0] = lookup(optarg, coll_names, C_NCOLL);
                o->ncolls = 1;
                bad = o->colls[0] < 0;
            }
            break;
        case 'b':
            bad = parse_size(optarg, &o->min_bytes);
            break;
        case 'e':
            bad = parse_size(optarg, &o->max_bytes);
            break;
        case 'f':
            o->factor = strtod(optarg, &end);
            bad = *end || !(o->factor > 1);
            break;
        case 'i':
            bad = parse_size(optarg, &o->step_bytes) || o->step_bytes == 0;
            break;
        case 's': {
            char buf[1024], *save = NULL;
            snprintf(buf, sizeof(buf), "%s", optarg);
            o->nlist = 0;
            for (char *t = strtok_r(buf, ",", &save); t && !bad; t = strtok_r(NULL, ",", &save)) {
                bad = o->nlist == PERF_MAX_SIZES || parse_size(t, &o->list[o->nlist]);
                o->nlist++;
            }
            bad |= o->nlist == 0;
            break;
        }
        case 'n':
            bad = parse_int(optarg, 1, 100000000, &o->iters);
            break;
        case 'w':
            bad = parse_int(optarg, 0, 100000000, &o->warmup);
            break;
        case 'T':
            o->time_budget = strtod(optarg, &end);
            bad = *end || !(o->time_budget > 0);
            break;
        case 'c':
            bad = parse_int(optarg, 0, 1, &o->check);
            break;
        case 'd':
            o->dt = NULL;
            for (size_t k = 0; k < sizeof(dtypes) / sizeof(dtypes[0]); k++)
                if (strcmp(optarg, dtypes[k].name) == 0 || strcmp(optarg, dtypes[k].alias) == 0)
                    o->dt = &dtypes[k];
            bad = o->dt == NULL;
            break;
        case 'o':
            idx = lookup(optarg, op_names, 5);
            bad = idx < 0;
            o->op = (hcclRedOp_t)idx;
            break;
        case 'r':
            bad = parse_int(optarg, 0, 1 << 30, &o->root);
            break;
        case 'a':
            o->algo = optarg;
            break;
        case 'z':
            bad = parse_int(optarg, 0, 1, &o->blocking);
            break;
        case 'N':
            bad = parse_int(optarg, 1, PERF_MAX_INFLIGHT, &o->inflight);
            break;
        case 'p':
            o->placements = strcmp(optarg, "oop") == 0    ? 1
                            : strcmp(optarg, "ip") == 0   ? 2
                            : strcmp(optarg, "both") == 0 ? 3
                                                          : 0;
            bad = o->placements == 0;
            break;
        case 1:
            o->csv = 1;
            break;
        case 2:
            o->json = 1;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "hccl-perf: bad value '%s' for -%c\n", optarg, c);
            return -1;
        }
    }
    if (optind < argc || (!o->nlist && o->min_bytes > o->max_bytes)) {
        fprintf(stderr, "hccl-perf: %s\n",
                optind < argc ? "unexpected argument" : "-b is above -e");
        return -1;
    }
    if (o->csv && o->json) {
        fprintf(stderr, "hccl-perf: --csv and --json exclude each other\n");
        return -1;
    }
    return 0;
}
