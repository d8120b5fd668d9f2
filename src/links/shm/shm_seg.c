/*
 * shm segment names, and the reclaiming of segments that crashed processes left behind.
 *
 * A segment is unlinked as soon as every local peer has mapped it, but until then (the
 * rendezvous and the link set-up) only its name holds it: a rank killed in that window
 * leaves it in /dev/shm for good. So the name says who made it, "/hccl-" then 32 hex
 * digits: the creator's pid namespace (low 32 bits of its inode), its pid, and 64 random
 * bits; and every rank that sets up shm first unlinks the segments of its own user whose
 * creator, in its own pid namespace, no longer exists.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "links/shm/shm.h"

#define SHM_DIR "/dev/shm"
#define SEG_PREFIX "hccl-"
#define SEG_HEX 32

static uint32_t pid_namespace(void)
{
    struct stat st;

    /* 0: unknown, and then nothing is reclaimed (a pid means nothing without its namespace). */
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint32_t)st.st_ino : 0;
}

hcclResult_t hccl_shm_seg_name(char *out, size_t len)
{
    uint8_t rnd[8];
    int o;

    HCCL_CHECK(hccl_random_bytes(rnd, sizeof(rnd)));
    o = snprintf(out, len, "/" SEG_PREFIX "%08x%08x", pid_namespace(), (unsigned)getpid());
    for (size_t i = 0; i < sizeof(rnd) && o > 0 && (size_t)o + 2 < len; i++)
        o += snprintf(out + o, len - (size_t)o, "%02x", rnd[i]);
    if (o != 1 + (int)strlen(SEG_PREFIX) + SEG_HEX)
        return HCCL_FAIL(hcclInternalError, "shm: segment name does not fit in %zu bytes", len);
    return hcclSuccess;
}

/* The creator of a segment named like ours, or false for any other name. */
static bool seg_creator(const char *name, uint32_t *ns_p, pid_t *pid_p)
{
    char field[9];
    size_t p = strlen(SEG_PREFIX);

    if (strncmp(name, SEG_PREFIX, p) != 0 || strlen(name) != p + SEG_HEX ||
        strspn(name + p, "0123456789abcdef") != SEG_HEX)
        return false;
    memcpy(field, name + p, 8);
    field[8] = '\0';
    *ns_p = (uint32_t)strtoul(field, NULL, 16);
    memcpy(field, name + p + 8, 8);
    *pid_p = (pid_t)strtoul(field, NULL, 16);
    return true;
}

int hccl_shm_reclaim_stale(void)
{
    uint32_t ns = pid_namespace(), seg_ns;
    DIR *d;
    struct dirent *e;
    int reclaimed = 0;
    pid_t pid;

    if (ns == 0 || !(d = opendir(SHM_DIR)))
        return 0;
    while ((e = readdir(d))) {
        struct stat st;
        char path[sizeof(e->d_name) + 2];
        if (!seg_creator(e->d_name, &seg_ns, &pid) || seg_ns != ns || pid <= 0 || pid == getpid())
            continue;
        /* Alive (or a zombie not reaped yet), or not ours to judge: left alone. */
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        snprintf(path, sizeof(path), "/%s", e->d_name);
        if (shm_unlink(path) == 0) {
            reclaimed++;
            HCCL_INFO(HCCL_SUB_LINK, "shm: removed %s, left by pid %d which no longer exists",
                      path, (int)pid);
        }
    }
    closedir(d);
    return reclaimed;
}

bool hccl_shm_room(size_t *room_p)
{
    struct statvfs st;

    if (statvfs(SHM_DIR, &st) != 0)
        return false;
    *room_p = (size_t)st.f_bavail * (size_t)st.f_frsize;
    return true;
}
