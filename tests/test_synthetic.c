/* tests/test_synthetic.c — the synthetic corpus (DESIGN 4): fixed by the seed, byte tokens
 * joined by EOT, every document a correct task, cheap to generate. */
#include "runtime/data.h"
#include "runtime/synthetic.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static Config config_for_synthetic(int seq_len, uint64_t seed)
{
    Config config;
    memset(&config, 0, sizeof config);
    config.model.vocab_size = SYNTHETIC_VOCAB_SIZE;
    config.train.seq_len = seq_len;
    config.seed = seed;
    config.data.source = DATA_SYNTHETIC;
    return config;
}

static uint32_t *synthetic_tokens(uint64_t seed, SyntheticSplit split, size_t count)
{
    uint32_t *tokens = malloc(count * sizeof *tokens);
    synthetic_generate(seed, split, tokens, count);
    return tokens;
}

Test(data, synthetic_corpus_is_fixed_by_the_seed)
{
    uint32_t *a = synthetic_tokens(9, SYNTHETIC_TRAIN, 4096);
    uint32_t *b = synthetic_tokens(9, SYNTHETIC_TRAIN, 4096);
    cr_assert_arr_eq(a, b, 4096 * sizeof *a);
    free(a);
    free(b);
}

Test(data, synthetic_corpus_differs_for_another_seed)
{
    uint32_t *a = synthetic_tokens(9, SYNTHETIC_TRAIN, 4096);
    uint32_t *b = synthetic_tokens(10, SYNTHETIC_TRAIN, 4096);
    cr_assert_arr_neq(a, b, 4096 * sizeof *a);
    free(a);
    free(b);
}

Test(data, synthetic_validation_stream_differs_from_training)
{
    uint32_t *train = synthetic_tokens(9, SYNTHETIC_TRAIN, 4096);
    uint32_t *validation = synthetic_tokens(9, SYNTHETIC_VALIDATION, 4096);
    cr_assert_arr_neq(train, validation, 4096 * sizeof *train);
    free(train);
    free(validation);
}

Test(data, synthetic_tokens_are_bytes_separated_by_eot)
{
    Config config = config_for_synthetic(127, 1);
    DataSet *set = data_open_train(&config);
    cr_assert_eq(data_eot_id(set), SYNTHETIC_EOT_ID);
    uint32_t window[128];
    int separators = 0;
    for (uint64_t i = 0; i < 64; i++) {
        data_read_window(set, i, window);
        for (int t = 0; t < 128; t++) {
            cr_assert_lt(window[t], SYNTHETIC_VOCAB_SIZE);
            separators += window[t] == SYNTHETIC_EOT_ID;
        }
    }
    cr_assert_gt(separators, 64 * 128 / SYNTHETIC_DOCUMENT_MAX);
    data_close(set);
}

/* 1 when `text` is a correct document of one of the three tasks. */
static int synthetic_document_is_correct(const char *text, int *task)
{
    unsigned long long a, b, sum;
    char word[16], reversed[16];
    int consumed = 0;
    if (sscanf(text, "%llu+%llu=%llu%n", &a, &b, &sum, &consumed) == 3 && !text[consumed]) {
        *task = 0;
        return a + b == sum;
    }
    if (sscanf(text, "rev %15[a-z]=%15[a-z]%n", word, reversed, &consumed) == 2 &&
        !text[consumed]) {
        *task = 1;
        size_t length = strlen(word);
        for (size_t i = 0; i < length; i++)
            if (reversed[length - 1 - i] != word[i])
                return 0;
        return strlen(reversed) == length;
    }
    const char *query = strchr(text, '?');
    int key, value, asked_key, asked_value;
    if (text[0] != 'k' || !query || sscanf(query, "?k%d=%d%n", &asked_key, &asked_value,
                                           &consumed) != 2 || query[consumed])
        return 0;
    *task = 2;
    for (const char *pair = text; pair < query; pair += 6)
        if (sscanf(pair, "k%d=%d", &key, &value) == 2 && key == asked_key)
            return value == asked_value;
    return 0;
}

Test(data, synthetic_documents_are_well_formed_tasks)
{
    char text[SYNTHETIC_DOCUMENT_MAX];
    int tasks_seen[3] = {0};
    for (uint64_t i = 0; i < 3000; i++) {
        synthetic_write_document(4, SYNTHETIC_TRAIN, i, text);
        int task = -1;
        cr_assert(synthetic_document_is_correct(text, &task), "document %llu: '%s'",
                  (unsigned long long)i, text);
        tasks_seen[task]++;
    }
    for (int task = 0; task < 3; task++)
        cr_assert_gt(tasks_seen[task], 800, "task %d appears %d times", task, tasks_seen[task]);
}

Test(data, synthetic_stream_is_documents_joined_by_eot)
{
    uint32_t *tokens = synthetic_tokens(4, SYNTHETIC_TRAIN, 2000);
    char text[SYNTHETIC_DOCUMENT_MAX];
    size_t position = 0;
    for (uint64_t i = 0; position + SYNTHETIC_DOCUMENT_MAX < 2000; i++) {
        int length = synthetic_write_document(4, SYNTHETIC_TRAIN, i, text);
        for (int c = 0; c < length; c++)
            cr_assert_eq(tokens[position + (size_t)c], (unsigned char)text[c]);
        cr_assert_eq(tokens[position + (size_t)length], SYNTHETIC_EOT_ID);
        position += (size_t)length + 1;
    }
    free(tokens);
}

Test(data, synthetic_training_corpus_is_generated_quickly)
{
    Config config = config_for_synthetic(255, 1);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    DataSet *set = data_open_train(&config);
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (double)(end.tv_sec - start.tv_sec) +
                     1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    cr_assert_geq(data_window_count(set), (1u << 20) / 256);
    cr_assert_lt(seconds, 0.2, "generation took %.3f s", seconds);
    data_close(set);
}
