/* runtime/synthetic.h — the synthetic byte-level corpus (DESIGN 4).
 *
 * A deterministic stream of short documents, each one small task whose answer can only be
 * produced by reading back over the context:
 *   addition   "417+86=503"           (operands of 1 to 6 digits)
 *   reversal   "rev abcde=edcba"      (2 to 12 lowercase letters)
 *   recall     "k3=71;k9=24;k1=05?k9=24"  (2 to 8 distinct keys k0..k9, two-digit values,
 *                                      the query names one of them)
 * Tokens are bytes 0..255 (vocab 256); NUL never appears in the text, so token 0 is the EOT
 * that follows every document. Document i of a split is a pure function of (seed, split, i)
 * through runtime/rng: nothing depends on what was generated before it. The training and
 * validation splits are different streams of the same seed.
 */
#ifndef FATHOM_RUNTIME_SYNTHETIC_H
#define FATHOM_RUNTIME_SYNTHETIC_H

#include <stddef.h>
#include <stdint.h>

#define SYNTHETIC_VOCAB_SIZE 256
#define SYNTHETIC_EOT_ID 0
/* The longest document (a recall of 8 keys) is 53 bytes; a text buffer of this size fits
 * any document and its terminating NUL. */
#define SYNTHETIC_DOCUMENT_MAX 64

typedef enum { SYNTHETIC_TRAIN, SYNTHETIC_VALIDATION } SyntheticSplit;

/* Writes document `index` of `split` into `text` (>= SYNTHETIC_DOCUMENT_MAX bytes,
 * NUL-terminated); returns its length in bytes. */
int synthetic_write_document(uint64_t seed, SyntheticSplit split, uint64_t index, char *text);

/* tokens[0 .. count): documents 0, 1, 2, ... of `split`, each followed by the EOT; the last
 * document is cut where the array ends. */
void synthetic_generate(uint64_t seed, SyntheticSplit split, uint32_t *tokens, size_t count);

#endif
