/* A program outside the tree: builds against the installed header and library only. */
#include <stdio.h>

#include <hccl.h>

int main(void)
{
    int version = 0;

    if (hcclGetVersion(&version) != hcclSuccess || version != HCCL_VERSION_CODE) {
        fprintf(stderr, "hcclGetVersion gave %d, header says %d\n", version, HCCL_VERSION_CODE);
        return 1;
    }
    printf("hccl %d works\n", version);
    return 0;
}
