/* A program outside the tree that finds an installed gcomp (CMake package or pkg-config). */
#include <stdio.h>
#include <string.h>

#include <gcomp.h>

int main(void)
{
    gcomp_codec *c = NULL;
    gcomp_result rc = gcomp_codec_create("topk:ratio=0.1+zstd", NULL, &c);
    int ok = rc == GCOMP_SUCCESS && strcmp(gcomp_codec_spec(c), "topk:ratio=0.1,k=0,values=fp32+zstd:level=1") == 0;
    printf("installed gcomp %d.%d.%d: %s\n", GCOMP_VERSION_MAJOR, GCOMP_VERSION_MINOR, GCOMP_VERSION_PATCH,
           ok ? "ok" : gcomp_last_error());
    gcomp_codec_destroy(c);
    return ok ? 0 : 1;
}
