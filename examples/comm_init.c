/*
 * comm_init: the three ways to create a communicator, then data-parallel and
 * tensor-parallel groups split from it.
 *
 *   hccl-run -n 4 ./comm_init        # 2 DP x 2 TP
 *   hccl-run -n 6 ./comm_init 3      # 2 DP x 3 TP (the argument is the TP size)
 *
 * 1. hcclCommInitFromEnv: rank, size and rendezvous from the launcher's
 *    environment (hccl-run, torchrun, mpirun, srun).
 * 2. hcclGetUniqueId on rank 0, the id handed to every rank, hcclCommInitRank.
 *    The id travels as text (hcclUniqueIdToString/FromString), so a file, an
 *    environment variable or a pipe would carry it just as well; here it is
 *    broadcast over the first communicator, as a framework would with its own
 *    bootstrap (MPI_Bcast, a key-value store).
 * 3. hcclCommInitGroup with a "host:port" everyone knows (HCCL_COMM_ID style):
 *    rank 0 listens there. Here rank 0 picks a free port on the host of the
 *    launcher's HCCL_COMM_ID and broadcasts it; a job script would fix one.
 *
 * Then hcclCommSplit twice: ranks with the same rank / TP form a tensor-parallel
 * group, those with the same rank % TP a data-parallel group. An AllReduce and
 * an AllGather on each group are checked against the members they must have.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hccl.h"

static int g_rank = -1;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcclResult_t r_ = (call);                                                                  \
        if (r_ != hcclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, hcclGetErrorString(r_), \
                    hcclGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: ", g_rank);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* An AllReduce of the world ranks over comm: proves every member is who it should be. */
static void check_members(hcclComm_t comm, const char *name, int expect_size, int expect_rank,
                          long expect_sum)
{
    int size, rank;
    long sum = g_rank;

    CHECK(hcclCommCount(comm, &size));
    CHECK(hcclCommUserRank(comm, &rank));
    EXPECT(size == expect_size && rank == expect_rank, "%s: rank %d of %d, want %d of %d", name,
           rank, size, expect_rank, expect_size);
    CHECK(hcclAllReduce(&sum, &sum, 1, hcclInt64, hcclSum, comm));
    EXPECT(sum == expect_sum, "%s: the sum of the members' world ranks is %ld, want %ld", name, sum,
           expect_sum);
}

/* Way 2: the unique id, created on rank 0 and carried as text. */
static hcclComm_t init_from_unique_id(hcclComm_t world, int n)
{
    char text[HCCL_UNIQUE_ID_STRLEN] = "";
    hcclUniqueId id;
    hcclComm_t comm;

    if (g_rank == 0) {
        CHECK(hcclGetUniqueId(&id));
        CHECK(hcclUniqueIdToString(&id, text, sizeof(text)));
    }
    CHECK(hcclBroadcast(text, sizeof(text), hcclUint8, 0, world));
    CHECK(hcclUniqueIdFromString(&id, text));
    CHECK(hcclCommInitRank(&comm, n, id, g_rank));
    return comm;
}

/* A port the kernel says is free now on host (IPv4), or 0. */
static int free_port(const char *host)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;

    if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        goto out;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
out:
    if (fd >= 0)
        close(fd);
    return port;
}

/* Way 3: hcclCommInitGroup at "host:port". */
static hcclComm_t init_group(hcclComm_t world, int n)
{
    const char *launcher_id = getenv("HCCL_COMM_ID");
    char host[256] = "127.0.0.1", comm_id[300];
    int32_t port = 0;
    hcclComm_t comm;

    if (launcher_id && strchr(launcher_id, ':')) {
        snprintf(host, sizeof(host), "%s", launcher_id);
        *strrchr(host, ':') = '\0';
    }
    if (g_rank == 0)
        port = free_port(host);
    CHECK(hcclBroadcast(&port, 1, hcclInt32, 0, world));
    EXPECT(port > 0, "rank 0 found no free port on %s", host);
    snprintf(comm_id, sizeof(comm_id), "%s:%d", host, port);
    CHECK(hcclCommInitGroup(&comm, (uint32_t)n, comm_id, (uint32_t)g_rank));
    return comm;
}

int main(int argc, char **argv)
{
    hcclComm_t world, by_id, by_group, tp_comm, dp_comm;
    int n, tp = 2, dp, tp_index, dp_index;
    long tp_sum = 0, dp_sum = 0;
    int32_t gathered[64];

    if (argc > 1)
        tp = atoi(argv[1]);
    /* Way 1: the launcher's environment. */
    CHECK(hcclCommInitFromEnv(&world));
    CHECK(hcclCommUserRank(world, &g_rank));
    CHECK(hcclCommCount(world, &n));
    EXPECT(tp >= 1 && n % tp == 0 && n <= 64,
           "the TP size %d must divide the %d ranks (at most 64)", tp, n);
    dp = n / tp;
    check_members(world, "hcclCommInitFromEnv", n, g_rank, (long)n * (n - 1) / 2);

    by_id = init_from_unique_id(world, n);
    check_members(by_id, "hcclCommInitRank", n, g_rank, (long)n * (n - 1) / 2);
    by_group = init_group(world, n);
    check_members(by_group, "hcclCommInitGroup", n, g_rank, (long)n * (n - 1) / 2);

    /* Tensor-parallel groups are consecutive ranks (one model replica, sharded); data-parallel
     * groups take the same shard from every replica. The key orders the new ranks. */
    tp_index = g_rank / tp;
    dp_index = g_rank % tp;
    CHECK(hcclCommSplit(world, tp_index, g_rank, &tp_comm));
    CHECK(hcclCommSplit(world, dp_index, g_rank, &dp_comm));
    for (int i = 0; i < tp; i++)
        tp_sum += tp_index * tp + i;
    for (int i = 0; i < dp; i++)
        dp_sum += i * tp + dp_index;
    check_members(tp_comm, "TP group", tp, dp_index, tp_sum);
    check_members(dp_comm, "DP group", dp, tp_index, dp_sum);

    /* The TP group's AllGather returns its members in the new rank order. */
    int32_t me = g_rank;
    CHECK(hcclAllGather(&me, gathered, 1, hcclInt32, tp_comm));
    for (int i = 0; i < tp; i++)
        EXPECT(gathered[i] == tp_index * tp + i, "TP group member %d is world rank %d, want %d", i,
               gathered[i], tp_index * tp + i);

    CHECK(hcclCommDestroy(dp_comm));
    CHECK(hcclCommDestroy(tp_comm));
    CHECK(hcclCommDestroy(by_group));
    CHECK(hcclCommDestroy(by_id));
    CHECK(hcclBarrier(world));
    printf("rank %d: world %d/%d, TP group %d (rank %d of %d), DP group %d (rank %d of %d)\n",
           g_rank, g_rank, n, tp_index, dp_index, tp, dp_index, tp_index, dp);
    CHECK(hcclCommDestroy(world));
    if (g_rank == 0)
        printf("comm_init: InitFromEnv, InitRank (unique id), InitGroup and %d DP x %d TP split "
               "checked\n",
               dp, tp);
    return 0;
}
