/* schedules_expected.h — hashes of every schedule case's results (tests/schedule_cases.h) per
 * rank count, printed by `GCOMP_LOOP_PRINT=1 build/tests/test_loop` and checked by test_loop
 * (thread-ranks) and test_mpi_allreduce (mpirun): the same bits over both transports. */
#ifndef GCOMP_SCHEDULES_EXPECTED_H
#define GCOMP_SCHEDULES_EXPECTED_H

#include <stdint.h>
#include <string.h>

static const struct {
    const char *name;
    int ranks;
    uint64_t hash;
} schedules_expected[] = {
    {"dense_fp16", 1, 0x760971e757d976f2ull},
    {"dense_fp16", 2, 0xbf32c566679a538eull},
    {"dense_fp16", 3, 0xe077066480bad33dull},
    {"dense_fp16", 4, 0x975d39215a5f4fd8ull},
    {"dense_fp16", 5, 0x028f56c173c7d04full},
    {"dense_fp16", 6, 0x3ddf0f7d4da2e1afull},
    {"dense_fp16", 7, 0xf38eba0537bfcc79ull},
    {"dense_fp16", 8, 0x02d27b7d9616037bull},
    {"dense_none_avg", 1, 0xbe346222752fc2a5ull},
    {"dense_none_avg", 2, 0x4abc956047a34c6cull},
    {"dense_none_avg", 3, 0xa7250cf659d926aaull},
    {"dense_none_avg", 4, 0xd34b81ad02af71a2ull},
    {"dense_none_avg", 5, 0x8c33e505ea252ea6ull},
    {"dense_none_avg", 6, 0xbee9762436604617ull},
    {"dense_none_avg", 7, 0x3574cdc77ce5863bull},
    {"dense_none_avg", 8, 0x4e67eeccde63e468ull},
    {"dense_fp16_ring", 1, 0x59af02363caf79bbull},
    {"dense_fp16_ring", 2, 0x052aadb390159472ull},
    {"dense_fp16_ring", 3, 0x5a01dec1e1607e20ull},
    {"dense_fp16_ring", 4, 0x414cc6b82b89d5b2ull},
    {"dense_fp16_ring", 5, 0x97f589f4b9726e69ull},
    {"dense_fp16_ring", 6, 0x71120705a91f0a55ull},
    {"dense_fp16_ring", 7, 0xe1e740109ad36716ull},
    {"dense_fp16_ring", 8, 0x4d71bbac6f4d5341ull},
    {"integer_terngrad_avg", 1, 0x760971e757d976f2ull},
    {"integer_terngrad_avg", 2, 0x590037ca21b17ae2ull},
    {"integer_terngrad_avg", 3, 0x75100b85f2b633f9ull},
    {"integer_terngrad_avg", 4, 0xae766764f02c4545ull},
    {"integer_terngrad_avg", 5, 0xc55f1b31059b92ceull},
    {"integer_terngrad_avg", 6, 0x33cc1d03c0eb8f26ull},
    {"integer_terngrad_avg", 7, 0x943a86bd2fd185e7ull},
    {"integer_terngrad_avg", 8, 0xf7ad682a4620e501ull},
    {"integer_terngrad_bucket", 1, 0x7e92a8a1e8201865ull},
    {"integer_terngrad_bucket", 2, 0xb4f1d8c6c246f46full},
    {"integer_terngrad_bucket", 3, 0x7b9723f0481582edull},
    {"integer_terngrad_bucket", 4, 0x21b950132547aed8ull},
    {"integer_terngrad_bucket", 5, 0x34768f89c386db98ull},
    {"integer_terngrad_bucket", 6, 0x48067bedff855289ull},
    {"integer_terngrad_bucket", 7, 0x9ec28c66e027e08dull},
    {"integer_terngrad_bucket", 8, 0xbb26b3a14a5e25ccull},
    {"sparse_topk", 1, 0x760971e757d976f2ull},
    {"sparse_topk", 2, 0xe8ef2eb35dce4542ull},
    {"sparse_topk", 3, 0x92189a83504a1a67ull},
    {"sparse_topk", 4, 0xbb65feb4824d2ac5ull},
    {"sparse_topk", 5, 0x884cf4669bbf93eeull},
    {"sparse_topk", 6, 0x9c20cf60138b32e6ull},
    {"sparse_topk", 7, 0xe9bf6281e298ab62ull},
    {"sparse_topk", 8, 0xd78115e74cc4ca83ull},
    {"sparse_as_dense_topk", 1, 0x88fd618b32716b90ull},
    {"sparse_as_dense_topk", 2, 0xef57d37702f8ca51ull},
    {"sparse_as_dense_topk", 3, 0xe8da6c0775b00252ull},
    {"sparse_as_dense_topk", 4, 0x7d109da81409b5c4ull},
    {"sparse_as_dense_topk", 5, 0xecf4d8eb05fa0a69ull},
    {"sparse_as_dense_topk", 6, 0x428a9084fafae71full},
    {"sparse_as_dense_topk", 7, 0x09348f406bb758a8ull},
    {"sparse_as_dense_topk", 8, 0x0e49419eb6a518d6ull},
    {"bypass_small", 1, 0x6140f604f72ae9d3ull},
    {"bypass_small", 2, 0x68d5f1fdb619ca37ull},
    {"bypass_small", 3, 0x54810c49e7d07ec5ull},
    {"bypass_small", 4, 0x5234faf9b5ef24baull},
    {"bypass_small", 5, 0x9810831725e4d8c8ull},
    {"bypass_small", 6, 0x2af423120a5b19d0ull},
    {"bypass_small", 7, 0x1f3dd2aa75cebcf0ull},
    {"bypass_small", 8, 0x4310e55797c26409ull},
};

/* The expected hash of case `name` at `ranks` ranks; 0 if the table has none. */
static inline uint64_t sc_expected_hash(const char *name, int ranks)
{
    for (size_t i = 0; i < sizeof schedules_expected / sizeof schedules_expected[0]; i++)
        if (strcmp(schedules_expected[i].name, name) == 0 && schedules_expected[i].ranks == ranks)
            return schedules_expected[i].hash;
    return 0;
}

#endif
