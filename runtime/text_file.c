/* runtime/text_file.c — see text_file.h. */
#include "runtime/text_file.h"

#include "runtime/error.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

char *text_file_read(const char *path, const char *what)
{
    FILE *file = fopen(path, "rb");
    if (!file)
        fatal(EXIT_CONFIG, "cannot open %s (%s): %s", path, what, strerror(errno));
    size_t length = 0, capacity = 4096;
    char *text = xmalloc(capacity);
    for (;;) {
        length += fread(text + length, 1, capacity - length - 1, file);
        if (ferror(file))
            fatal(EXIT_CONFIG, "cannot read %s (%s): %s", path, what, strerror(errno));
        if (feof(file))
            break;
        capacity *= 2;
        text = xrealloc(text, capacity);
    }
    if (fclose(file) != 0)
        fatal(EXIT_CONFIG, "cannot read %s (%s): %s", path, what, strerror(errno));
    text[length] = '\0';
    if (strlen(text) != length)
        fatal(EXIT_CONFIG, "%s (%s) holds a NUL byte: not text", path, what);
    return text;
}
