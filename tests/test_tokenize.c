/* tests/test_tokenize.c — launch/tools/tokenize.py writes shards that the DataSet reads back
 * as the tokenizer's own ids, documents joined by EOT (DESIGN 4).
 *
 * Each test builds a tiny WordLevel tokenizer with the Hugging Face `tokenizers` library in
 * a temp directory, writes a small .jsonl and .txt corpus, and has Python print the ids the
 * tokenizer gives; the C side compares them with what it reads from the shards. Without
 * tokenizers / h5py / numpy these tests fail (they are required, not optional).
 */
#include "runtime/data.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_TOKENS = 256 };

/* Writes tokenizer.json, docs.jsonl (3 documents) and story.txt (1 document); prints
 * "<eot id> <token count> <ids of every document, each followed by the eot id>". */
static const char make_corpus_py[] =
    "import json\n"
    "from tokenizers import Tokenizer, models, pre_tokenizers\n"
    "words = ['[UNK]', 'the', 'cat', 'sat', 'on', 'mat', '<|end_of_text|>', 'a', 'dog',\n"
    "         'ran', '.']\n"
    "tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},\n"
    "                                       unk_token='[UNK]'))\n"
    "tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()\n"
    "tokenizer.save('tokenizer.json')\n"
    "documents = ['the cat sat on the mat .', 'a dog ran .', 'the dog sat on a cat .']\n"
    "with open('docs.jsonl', 'w') as file:\n"
    "    for text in documents:\n"
    "        file.write(json.dumps({'text': text}) + '\\n')\n"
    "story = 'a cat ran on a mat .\\n\\nthe dog ran .\\n'\n"
    "open('story.txt', 'w').write(story)\n"
    "eot = tokenizer.token_to_id('<|end_of_text|>')\n"
    "stream = []\n"
    "for text in documents + [story]:\n"
    "    stream += tokenizer.encode(text, add_special_tokens=False).ids + [eot]\n"
    "print(eot, len(stream), *stream)\n";

typedef struct {
    char directory[256];
    char shards[300];     /* the output directory of tokenize.py */
    uint32_t eot_id;
    int token_count;
    uint32_t expected[MAX_TOKENS];
} Corpus;

static void require_python_modules(void)
{
    char output[2048];
    int code = test_run_command("python3 -c 'import tokenizers, h5py, numpy'", output,
                                sizeof output);
    cr_assert_eq(code, 0, "the tokenize tests need python3 with tokenizers, h5py and numpy "
                 "(pip install tokenizers h5py numpy): %s", output);
}

/* Runs tokenize.py in the corpus directory with `arguments`; returns its exit code. */
static int run_tokenize(const Corpus *corpus, const char *arguments, char *output,
                        size_t capacity)
{
    char command[2048];
    snprintf(command, sizeof command, "cd '%s' && python3 '%s/launch/tools/tokenize.py' %s",
             corpus->directory, FATHOM_SOURCE_DIR, arguments);
    return test_run_command(command, output, capacity);
}

static void make_corpus(Corpus *corpus)
{
    require_python_modules();
    test_make_temp_dir(corpus->directory, "tokenize");
    snprintf(corpus->shards, sizeof corpus->shards, "%s/shards", corpus->directory);
    char path[300], command[512], output[4096];
    snprintf(path, sizeof path, "%s/make_corpus.py", corpus->directory);
    test_write_file(path, make_corpus_py);
    snprintf(command, sizeof command, "cd '%s' && python3 make_corpus.py", corpus->directory);
    cr_assert_eq(test_run_command(command, output, sizeof output), 0, "%s", output);
    char *cursor = output;
    corpus->eot_id = (uint32_t)strtoul(cursor, &cursor, 10);
    corpus->token_count = (int)strtol(cursor, &cursor, 10);
    cr_assert(corpus->token_count > 0 && corpus->token_count <= MAX_TOKENS, "%s", output);
    for (int i = 0; i < corpus->token_count; i++)
        corpus->expected[i] = (uint32_t)strtoul(cursor, &cursor, 10);
}

/* Tokenizes the corpus into shards of 5 tokens, so documents cross shard boundaries. */
static void tokenize_corpus(const Corpus *corpus)
{
    char output[4096];
    int code = run_tokenize(corpus, "--tokenizer tokenizer.json --output shards "
                            "--shard-tokens 5 docs.jsonl story.txt", output, sizeof output);
    cr_assert_eq(code, 0, "tokenize.py failed: %s", output);
}

/* The whole token stream of the shards, read as one window through the DataSet API. */
static DataSet *open_as_one_window(const Corpus *corpus, uint32_t *window)
{
    Config config;
    memset(&config, 0, sizeof config);
    config.model.vocab_size = 16;
    config.train.seq_len = corpus->token_count - 1;
    config.data.source = DATA_SHARDS;
    DataSet *set = data_open_eval(&config, corpus->shards);
    cr_assert_eq(data_window_count(set), 1);
    data_read_window(set, 0, window);
    return set;
}

Test(tokenize, shards_hold_the_tokenizer_ids_of_every_document_in_order)
{
    Corpus corpus;
    make_corpus(&corpus);
    tokenize_corpus(&corpus);
    uint32_t window[MAX_TOKENS];
    DataSet *set = open_as_one_window(&corpus, window);
    for (int i = 0; i < corpus.token_count; i++)
        cr_assert_eq(window[i], corpus.expected[i], "token %d: %u, tokenizer gives %u", i,
                     window[i], corpus.expected[i]);
    data_close(set);
    test_remove_tree(corpus.directory);
}

Test(tokenize, eot_id_follows_each_of_the_four_documents)
{
    Corpus corpus;
    make_corpus(&corpus);
    tokenize_corpus(&corpus);
    uint32_t window[MAX_TOKENS];
    DataSet *set = open_as_one_window(&corpus, window);
    cr_assert_eq(data_eot_id(set), corpus.eot_id);
    int separators = 0;
    for (int i = 0; i < corpus.token_count; i++)
        separators += window[i] == corpus.eot_id;
    cr_assert_eq(separators, 4);
    cr_assert_eq(window[corpus.token_count - 1], corpus.eot_id);
    data_close(set);
    test_remove_tree(corpus.directory);
}

Test(tokenize, shard_attributes_name_the_tokenizer_and_its_vocab_size)
{
    Corpus corpus;
    make_corpus(&corpus);
    tokenize_corpus(&corpus);
    char path[400];
    snprintf(path, sizeof path, "%s/shard_00000.h5", corpus.shards);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(file, 0, "cannot open %s", path);
    int64_t vocab_size = 0;
    hid_t attribute = H5Aopen(file, "vocab_size", H5P_DEFAULT);
    cr_assert_geq(H5Aread(attribute, H5T_NATIVE_INT64, &vocab_size), 0);
    H5Aclose(attribute);
    cr_assert_eq(vocab_size, 11);
    attribute = H5Aopen(file, "tokenizer", H5P_DEFAULT);
    hid_t type = H5Aget_type(attribute);
    char *name = NULL;
    cr_assert(H5Tis_variable_str(type) > 0, "the tokenizer attribute is not a string");
    hid_t memory_type = H5Tcopy(H5T_C_S1);
    H5Tset_size(memory_type, H5T_VARIABLE);
    H5Tset_cset(memory_type, H5T_CSET_UTF8);
    cr_assert_geq(H5Aread(attribute, memory_type, &name), 0);
    cr_assert_str_eq(name, "tokenizer.json");
    H5free_memory(name);
    H5Tclose(memory_type);
    H5Tclose(type);
    H5Aclose(attribute);
    H5Fclose(file);
    test_remove_tree(corpus.directory);
}

Test(tokenize, missing_input_file_exits_2_naming_it)
{
    Corpus corpus;
    make_corpus(&corpus);
    char output[4096];
    int code = run_tokenize(&corpus, "--tokenizer tokenizer.json --output shards absent.jsonl",
                            output, sizeof output);
    cr_assert_eq(code, 2, "exit code %d: %s", code, output);
    cr_assert(strstr(output, "absent.jsonl"), "%s", output);
    test_remove_tree(corpus.directory);
}

Test(tokenize, jsonl_line_without_the_text_field_exits_3_naming_the_line)
{
    Corpus corpus;
    make_corpus(&corpus);
    char path[300], output[4096];
    snprintf(path, sizeof path, "%s/bad.jsonl", corpus.directory);
    test_write_file(path, "{\"text\": \"the cat\"}\n{\"body\": \"a dog\"}\n");
    int code = run_tokenize(&corpus, "--tokenizer tokenizer.json --output shards bad.jsonl",
                            output, sizeof output);
    cr_assert_eq(code, 3, "exit code %d: %s", code, output);
    cr_assert(strstr(output, "bad.jsonl:2"), "%s", output);
    test_remove_tree(corpus.directory);
}

Test(tokenize, an_output_that_is_a_file_is_a_one_line_error_exit_2)
{
    Corpus corpus;
    make_corpus(&corpus);
    char path[300], output[4096];
    snprintf(path, sizeof path, "%s/taken", corpus.directory);
    test_write_file(path, "not a directory\n");
    int code = run_tokenize(&corpus, "--tokenizer tokenizer.json --output taken docs.jsonl",
                            output, sizeof output);
    cr_assert_eq(code, 2, "exit code %d: %s", code, output);
    cr_expect(strstr(output, "taken") && strstr(output, "is a file"), "%s", output);
    cr_expect(!strstr(output, "Traceback"), "%s", output);
    test_remove_tree(corpus.directory);
}

Test(tokenize, the_summary_names_the_vocab_size_to_train_with)
{
    Corpus corpus;
    make_corpus(&corpus);
    char output[4096];
    int code = run_tokenize(&corpus, "--tokenizer tokenizer.json --output shards docs.jsonl",
                            output, sizeof output);
    cr_assert_eq(code, 0, "exit code %d: %s", code, output);
    cr_expect(strstr(output, "--set model.vocab_size=auto (reads 11 from the shards)"), "%s",
              output);
    test_remove_tree(corpus.directory);
}

/* launch/tools/bytes_tokenizer.json, the one README tokenizes with: a .md file is one
 * document, its ids are the bytes of its UTF-8 text, then EOT 256; vocab_size 257. */
Test(tokenize, the_byte_tokenizer_gives_the_utf8_bytes_of_a_markdown_file)
{
    require_python_modules();
    Corpus corpus = {0};
    test_make_temp_dir(corpus.directory, "tokenize-bytes");
    snprintf(corpus.shards, sizeof corpus.shards, "%s/shards", corpus.directory);
    static const char text[] = "# Tiefe\n\nh\xc3\xa9llo \xe2\x86\x92 depth\n";
    char path[400], arguments[600], output[4096];
    snprintf(path, sizeof path, "%s/notes.md", corpus.directory);
    test_write_file(path, text);
    snprintf(arguments, sizeof arguments, "--tokenizer '%s/launch/tools/bytes_tokenizer.json' "
             "--output shards notes.md", FATHOM_SOURCE_DIR);
    cr_assert_eq(run_tokenize(&corpus, arguments, output, sizeof output), 0, "%s", output);
    cr_expect(strstr(output, "vocab_size 257, eot_id 256"), "%s", output);
    const size_t length = strlen(text);
    Config config;
    memset(&config, 0, sizeof config);
    config.model.vocab_size = 257;
    config.train.seq_len = (int)length;
    config.data.source = DATA_SHARDS;
    DataSet *set = data_open_eval(&config, corpus.shards);
    cr_assert_eq(data_window_count(set), 1);
    uint32_t window[MAX_TOKENS];
    data_read_window(set, 0, window);
    for (size_t i = 0; i < length; i++)
        cr_assert_eq(window[i], (unsigned char)text[i], "byte %zu", i);
    cr_assert_eq(window[length], 256);
    data_close(set);
    test_remove_tree(corpus.directory);
}
