/* Topology: which ranks share a host, and which link joins each pair. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"

static void read_first_line(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");

    out[0] = '\0';
    if (!f)
        return;
    if (fgets(out, (int)len, f))
        out[strcspn(out, "\n")] = '\0';
    fclose(f);
}

/*
 * Two ranks are on one host when they share the hostname, the kernel boot
 * and the network namespace: ranks in separate namespaces are treated as
 * separate hosts, which is how tests build several hosts on one machine.
 */
void hccl_topo_host_id(const hccl_params_t *p, char *out, size_t len)
{
    char host[64] = "", boot[40] = "", netns[40] = "";
    ssize_t n;

    if (p->host_id[0]) {
        snprintf(out, len, "%s", p->host_id);
        return;
    }
    gethostname(host, sizeof(host) - 1);
    read_first_line("/proc/sys/kernel/random/boot_id", boot, sizeof(boot));
    n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
    netns[n > 0 ? n : 0] = '\0';
    snprintf(out, len, "%.40s/%.8s/%.28s", host, boot, netns);
}

int hccl_topo_pick_link(const hccl_card_t *me, const hccl_card_t *peer)
{
    static const int preference[] = {HCCL_LINK_SHM, HCCL_LINK_TCP};

    for (size_t i = 0; i < sizeof(preference) / sizeof(preference[0]); i++) {
        int id = preference[i];
        const hccl_link_ops_t *ops = hccl_link_by_id(id);
        if ((me->links & (1u << id)) && (peer->links & (1u << id)) && ops->reaches(me, peer))
            return id;
    }
    return -1;
}
