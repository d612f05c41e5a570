/* runtime/synthetic.c — see synthetic.h. */
#include "runtime/synthetic.h"

#include "runtime/rng.h"

#include <stdio.h>
#include <string.h>

/* Each document draws its random numbers from its own block of the split's stream, so
 * document i never depends on how many numbers the documents before it used. */
enum { DRAWS_PER_DOCUMENT = 64 };

typedef struct {
    uint64_t seed, stream, next;
} Draws;

/* A number in [0, bound); the modulo bias is below 2^-50 for these bounds. */
static uint64_t draw_below(Draws *draws, uint64_t bound)
{
    return rng_bits(draws->seed, draws->stream, draws->next++) % bound;
}

static uint64_t draw_number_of_digits(Draws *draws, int digits)
{
    uint64_t low = 1, high = 10;
    for (int i = 1; i < digits; i++) {
        low *= 10;
        high *= 10;
    }
    if (digits == 1)
        low = 0;
    return low + draw_below(draws, high - low);
}

/* "417+86=503" */
static int write_addition(Draws *draws, char *text)
{
    int digits_a = 1 + (int)draw_below(draws, 6), digits_b = 1 + (int)draw_below(draws, 6);
    uint64_t a = draw_number_of_digits(draws, digits_a);
    uint64_t b = draw_number_of_digits(draws, digits_b);
    return snprintf(text, SYNTHETIC_DOCUMENT_MAX, "%llu+%llu=%llu", (unsigned long long)a,
                    (unsigned long long)b, (unsigned long long)(a + b));
}

/* "rev abcde=edcba" */
static int write_reversal(Draws *draws, char *text)
{
    int letters = 2 + (int)draw_below(draws, 11);
    char word[16];
    for (int i = 0; i < letters; i++)
        word[i] = (char)('a' + draw_below(draws, 26));
    int length = sprintf(text, "rev %.*s=", letters, word);
    for (int i = letters - 1; i >= 0; i--)
        text[length++] = word[i];
    text[length] = '\0';
    return length;
}

/* "k3=71;k9=24;k1=05?k9=24" */
static int write_recall(Draws *draws, char *text)
{
    int pairs = 2 + (int)draw_below(draws, 7);
    int keys[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    int values[8];
    for (int i = 0; i < pairs; i++) { /* the first `pairs` steps of a Fisher-Yates shuffle */
        int j = i + (int)draw_below(draws, (uint64_t)(10 - i));
        int swap = keys[i];
        keys[i] = keys[j];
        keys[j] = swap;
        values[i] = (int)draw_below(draws, 100);
    }
    int length = 0;
    for (int i = 0; i < pairs; i++)
        length += sprintf(text + length, "%sk%d=%02d", i ? ";" : "", keys[i], values[i]);
    int asked = (int)draw_below(draws, (uint64_t)pairs);
    length += sprintf(text + length, "?k%d=%02d", keys[asked], values[asked]);
    return length;
}

static uint64_t split_stream(SyntheticSplit split)
{
    return rng_stream_of_name(split == SYNTHETIC_TRAIN ? "synthetic.train"
                                                       : "synthetic.validation");
}

int synthetic_write_document(uint64_t seed, SyntheticSplit split, uint64_t index, char *text)
{
    Draws draws = {seed, split_stream(split), index * DRAWS_PER_DOCUMENT};
    switch (draw_below(&draws, 3)) {
    case 0: return write_addition(&draws, text);
    case 1: return write_reversal(&draws, text);
    default: return write_recall(&draws, text);
    }
}

void synthetic_generate(uint64_t seed, SyntheticSplit split, uint32_t *tokens, size_t count)
{
    char text[SYNTHETIC_DOCUMENT_MAX];
    size_t used = 0;
    for (uint64_t document = 0; used < count; document++) {
        int length = synthetic_write_document(seed, split, document, text);
        for (int i = 0; i < length && used < count; i++)
            tokens[used++] = (unsigned char)text[i];
        if (used < count)
            tokens[used++] = SYNTHETIC_EOT_ID;
    }
}
