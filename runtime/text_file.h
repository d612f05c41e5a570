/* runtime/text_file.h — a whole text file read into one NUL-terminated string.
 *
 * For the files a user names whose text is parsed whole (the config's YAML, the matmul
 * algorithms table). A file that cannot be opened or read, or that holds a NUL byte (not
 * text), is fatal with exit 2, naming `what` and the path. The caller frees the string.
 */
#ifndef FATHOM_RUNTIME_TEXT_FILE_H
#define FATHOM_RUNTIME_TEXT_FILE_H

char *text_file_read(const char *path, const char *what);

#endif
