/* checkpoints/checkpoint.c — checkpoint names, paths and the file system under them: finding
 * the newest committed step, fsync, removal (DESIGN 5). See checkpoint_layout.h. */
#include "checkpoints/checkpoint_layout.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/crc32c.h"
#include "runtime/error.h"

static const char *const group_paths[CKPT_GROUPS] = {
    [CKPT_GROUP_MODEL] = "/model",
    [CKPT_GROUP_EMA] = "/ema",
    [CKPT_GROUP_EXP_AVG] = "/optim/exp_avg",
    [CKPT_GROUP_EXP_AVG_SQ] = "/optim/exp_avg_sq",
};

const char *checkpoint_group_path(int group)
{
    return group >= 0 && group < CKPT_GROUPS ? group_paths[group] : NULL;
}

void checkpoint_path_join(char *out, size_t capacity, const char *dir, const char *name)
{
    if (!dir[0])
        dir = "."; /* an empty run_dir is the working directory, never the root */
    int length = snprintf(out, capacity, "%s/%s", dir, name);
    if (length < 0 || (size_t)length >= capacity)
        fatal(EXIT_DATA, "checkpoint path %s/%s is longer than %zu bytes", dir, name,
              capacity - 1);
}

void checkpoint_step_name(int64_t step, char *name, size_t capacity)
{
    snprintf(name, capacity, "step_%08lld", (long long)step);
}

void checkpoint_shard_name(int stage, int dp_rank, char *name, size_t capacity)
{
    snprintf(name, capacity, "shard_p%d_d%d.h5", stage, dp_rank);
}

bool checkpoint_parse_step_name(const char *name, int64_t *step, bool *is_tmp)
{
    if (strncmp(name, "step_", 5) != 0 || !isdigit((unsigned char)name[5]))
        return false;
    const char *digits_end = name + 5;
    while (isdigit((unsigned char)*digits_end))
        digits_end++;
    if (digits_end - (name + 5) > 18)
        return false; /* would overflow int64 */
    bool tmp = strcmp(digits_end, CHECKPOINT_TMP_SUFFIX) == 0;
    if (*digits_end != '\0' && !tmp)
        return false;
    *step = strtoll(name + 5, NULL, 10);
    *is_tmp = tmp;
    return true;
}

void checkpoint_dataset_path(int group, const char *name, char *out, size_t capacity)
{
    checkpoint_path_join(out, capacity, group_paths[group], name);
}

int64_t checkpoint_tensor_row_elements(const CheckpointTensor *tensor)
{
    int64_t elements = 1;
    for (int axis = 1; axis < tensor->ndim; axis++)
        elements *= tensor->shape[axis];
    return elements;
}

void checkpoint_shape_format(int ndim, const int64_t *shape, char *text, size_t capacity)
{
    size_t used = 0;
    text[0] = '\0';
    for (int axis = 0; axis < ndim && used < capacity; axis++) {
        int written = snprintf(text + used, capacity - used, "%s%lld", axis ? ", " : "[",
                               (long long)shape[axis]);
        if (written < 0)
            break;
        used += (size_t)written;
    }
    if (used < capacity)
        snprintf(text + used, capacity - used, "]");
}

void checkpoint_tensors_validate(const CheckpointTensor *tensors, int n_tensors)
{
    for (int i = 0; i < n_tensors; i++) {
        const CheckpointTensor *tensor = &tensors[i];
        const char *name = tensor->name;
        /* a dataset name is one HDF5 link: no separator; '%' is printf syntax in virtual
         * dataset source names (H5Pset_virtual) */
        if (!name || !*name || strchr(name, '/') || strchr(name, '%') ||
            strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            fatal(EXIT_DATA, "checkpoint tensor %d has an unusable name \"%s\"", i,
                  name ? name : "(null)");
        if (tensor->ndim < 1 || tensor->ndim > CHECKPOINT_RANK_MAX)
            fatal(EXIT_DATA, "checkpoint tensor %s has rank %d; tensors have rank 1 to %d",
                  name, tensor->ndim, CHECKPOINT_RANK_MAX);
        char shape[CHECKPOINT_SHAPE_TEXT_MAX];
        for (int axis = 0; axis < tensor->ndim; axis++)
            if (tensor->shape[axis] < 1) {
                checkpoint_shape_format(tensor->ndim, tensor->shape, shape, sizeof shape);
                fatal(EXIT_DATA, "checkpoint tensor %s has an unusable shape %s", name, shape);
            }
        for (int j = 0; j < i; j++)
            if (strcmp(tensors[j].name, name) == 0)
                fatal(EXIT_DATA, "checkpoint tensor %s is listed twice", name);
    }
}

bool checkpoint_path_exists(const char *path)
{
    struct stat status;
    return lstat(path, &status) == 0;
}

bool checkpoint_is_directory(const char *path)
{
    struct stat status;
    return stat(path, &status) == 0 && S_ISDIR(status.st_mode);
}

bool checkpoint_is_committed(const char *step_dir)
{
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(path, sizeof path, step_dir, CHECKPOINT_COMMIT_FILE);
    struct stat status;
    return stat(path, &status) == 0 && S_ISREG(status.st_mode);
}

void checkpoint_make_directory(const char *path)
{
    char partial[CHECKPOINT_PATH_MAX];
    if (!path[0] || strlen(path) >= sizeof partial)
        fatal(EXIT_DATA, "cannot create directory \"%s\": empty or too long", path);
    strcpy(partial, path);
    /* create each prefix in turn, like mkdir -p */
    for (char *slash = partial + 1;; slash++) {
        bool end = *slash == '\0';
        if (*slash != '/' && !end)
            continue;
        *slash = '\0';
        if (mkdir(partial, 0777) != 0 && errno != EEXIST)
            fatal(EXIT_DATA, "cannot create directory %s: %s", partial, strerror(errno));
        if (!checkpoint_is_directory(partial))
            fatal(EXIT_DATA, "cannot create directory %s: a file of that name is in the way",
                  partial);
        if (end)
            break;
        *slash = '/';
    }
}

void checkpoint_sync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fatal(EXIT_DATA, "cannot open %s to sync it: %s", path, strerror(errno));
    if (fsync(fd) != 0)
        fatal(EXIT_DATA, "cannot sync %s to disk: %s", path, strerror(errno));
    close(fd);
}

void checkpoint_write_text_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        fatal(EXIT_DATA, "cannot create %s: %s", path, strerror(errno));
    size_t length = strlen(text), written = 0;
    while (written < length) {
        ssize_t n = write(fd, text + written, length - written);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fatal(EXIT_DATA, "cannot write %s: %s", path, strerror(errno));
        written += (size_t)n;
    }
    if (fsync(fd) != 0 || close(fd) != 0)
        fatal(EXIT_DATA, "cannot write %s to disk: %s", path, strerror(errno));
}

static int remove_entry(const char *path, const struct stat *status, int type, struct FTW *walk)
{
    (void)status;
    (void)type;
    (void)walk;
    if (remove(path) != 0 && errno != ENOENT)
        fatal(EXIT_DATA, "cannot remove %s: %s", path, strerror(errno));
    return 0;
}

void checkpoint_remove_tree(const char *path)
{
    if (!checkpoint_path_exists(path))
        return;
    /* depth first, links not followed: a symlink inside is removed, not its target */
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fatal(EXIT_DATA, "cannot remove %s: %s", path, strerror(errno));
}

/* The step name in checkpoints_dir/latest, when the file holds one (trailing space ignored). */
static bool latest_read(const char *checkpoints_dir, char *name, size_t capacity)
{
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(path, sizeof path, checkpoints_dir, CHECKPOINT_LATEST_FILE);
    FILE *file = fopen(path, "r");
    if (!file)
        return false;
    bool ok = fgets(name, (int)capacity, file) != NULL;
    fclose(file);
    if (!ok)
        return false;
    size_t length = strlen(name);
    while (length > 0 && isspace((unsigned char)name[length - 1]))
        name[--length] = '\0';
    int64_t step;
    bool is_tmp;
    /* only a plain step name: `latest` never steers the reader outside checkpoints_dir */
    return checkpoint_parse_step_name(name, &step, &is_tmp) && !is_tmp;
}

bool checkpoint_find_latest_in(const char *checkpoints_dir, char *step_dir, size_t capacity)
{
    char name[256], path[CHECKPOINT_PATH_MAX];
    if (latest_read(checkpoints_dir, name, sizeof name)) {
        checkpoint_path_join(path, sizeof path, checkpoints_dir, name);
        if (checkpoint_is_committed(path)) {
            checkpoint_path_join(step_dir, capacity, checkpoints_dir, name);
            return true;
        }
    }
    /* `latest` missing or stale (a crash between commit and its update, or a deleted step):
     * the highest committed step wins */
    DIR *listing = opendir(checkpoints_dir);
    if (!listing)
        return false;
    int64_t best_step = -1;
    char best_name[256] = "";
    for (struct dirent *entry; (entry = readdir(listing)) != NULL;) {
        int64_t step;
        bool is_tmp;
        if (!checkpoint_parse_step_name(entry->d_name, &step, &is_tmp) || is_tmp ||
            step <= best_step || strlen(entry->d_name) >= sizeof best_name)
            continue;
        checkpoint_path_join(path, sizeof path, checkpoints_dir, entry->d_name);
        if (checkpoint_is_committed(path)) {
            best_step = step;
            strcpy(best_name, entry->d_name);
        }
    }
    closedir(listing);
    if (best_step < 0)
        return false;
    checkpoint_path_join(step_dir, capacity, checkpoints_dir, best_name);
    return true;
}

bool checkpoint_find_latest(const char *run_dir, char *step_dir, size_t capacity)
{
    char checkpoints_dir[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(checkpoints_dir, sizeof checkpoints_dir, run_dir, CHECKPOINT_DIRECTORY);
    return checkpoint_find_latest_in(checkpoints_dir, step_dir, capacity);
}

void checkpoint_resolve_step_dir(const char *dir, char *step_dir, size_t capacity)
{
    char path[CHECKPOINT_PATH_MAX];
    if (!checkpoint_is_directory(dir))
        fatal(EXIT_DATA, "checkpoint directory %s does not exist", dir);
    checkpoint_path_join(path, sizeof path, dir, CHECKPOINT_INDEX_FILE);
    if (checkpoint_path_exists(path)) {
        if (!checkpoint_is_committed(dir))
            fatal(EXIT_DATA, "checkpoint %s has no %s file: its save did not finish", dir,
                  CHECKPOINT_COMMIT_FILE);
        if (strlen(dir) >= capacity)
            fatal(EXIT_DATA, "checkpoint path %s is longer than %zu bytes", dir, capacity - 1);
        strcpy(step_dir, dir);
        return;
    }
    checkpoint_path_join(path, sizeof path, dir, CHECKPOINT_DIRECTORY);
    bool found = checkpoint_is_directory(path)
                     ? checkpoint_find_latest_in(path, step_dir, capacity)
                     : checkpoint_find_latest_in(dir, step_dir, capacity);
    if (!found)
        fatal(EXIT_DATA, "no committed checkpoint in %s", dir);
}

/* ---- the digest of index.h5 in COMMITTED ---- */

/* Size and CRC32C of a whole file, read in blocks; false when it cannot be read. */
static bool file_digest(const char *path, uint64_t *size, uint32_t *crc)
{
    FILE *file = fopen(path, "rb");
    if (!file)
        return false;
    enum { BLOCK = 1 << 20 };
    char *buffer = xmalloc(BLOCK);
    *size = 0;
    *crc = 0;
    for (size_t got; (got = fread(buffer, 1, BLOCK, file)) > 0;) {
        *crc = crc32c_extend(*crc, buffer, got);
        *size += got;
    }
    const bool ok = !ferror(file);
    fclose(file);
    free(buffer);
    return ok;
}

void checkpoint_commit_text(const char *step_dir, const char *step_name, char *text,
                            size_t capacity)
{
    char index_path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(index_path, sizeof index_path, step_dir, CHECKPOINT_INDEX_FILE);
    uint64_t size;
    uint32_t crc;
    if (!file_digest(index_path, &size, &crc))
        fatal(EXIT_DATA, "cannot read %s back to digest it: %s", index_path, strerror(errno));
    snprintf(text, capacity, "%s\n" CHECKPOINT_INDEX_FILE " %llu %08x\n", step_name,
             (unsigned long long)size, (unsigned)crc);
}

void checkpoint_index_verify(const char *step_dir, const char *index_path)
{
    char commit_path[CHECKPOINT_PATH_MAX], text[512] = "";
    checkpoint_path_join(commit_path, sizeof commit_path, step_dir, CHECKPOINT_COMMIT_FILE);
    FILE *file = fopen(commit_path, "r");
    if (!file)
        return; /* uncommitted: the caller refuses it (checkpoint_resolve_step_dir) */
    const size_t got = fread(text, 1, sizeof text - 1, file);
    fclose(file);
    text[got] = '\0';
    const char *line = strchr(text, '\n');
    unsigned long long recorded_size;
    unsigned recorded_crc;
    if (!line || sscanf(line + 1, CHECKPOINT_INDEX_FILE " %llu %x", &recorded_size,
                        &recorded_crc) != 2)
        return; /* a COMMITTED of an older save names the step only */
    uint64_t size;
    uint32_t crc;
    if (!file_digest(index_path, &size, &crc))
        fatal(EXIT_DATA, "cannot read checkpoint index %s: %s", index_path, strerror(errno));
    if (size != recorded_size || crc != recorded_crc)
        fatal(EXIT_DATA, "checkpoint index %s is corrupt: %llu bytes with CRC32C %08x, "
              "COMMITTED recorded %llu bytes with %08x", index_path, (unsigned long long)size,
              (unsigned)crc, recorded_size, recorded_crc);
}
