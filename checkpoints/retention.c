/* checkpoints/retention.c — which step directories stay (DESIGN 5, checkpoint.keep_last and
 * checkpoint.keep_every); see checkpoint_apply_retention in checkpoint.h. */
#include "checkpoints/checkpoint_layout.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

typedef struct {
    char name[64];
    int64_t step;
    bool is_tmp, committed;
} StepEntry;

static int step_entry_compare_newest_first(const void *a, const void *b)
{
    int64_t step_a = ((const StepEntry *)a)->step, step_b = ((const StepEntry *)b)->step;
    return (step_a < step_b) - (step_a > step_b);
}

/* Removes a step directory so that no crash midway leaves something that looks committed. */
static void step_directory_delete(const char *path)
{
    char commit_file[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(commit_file, sizeof commit_file, path, CHECKPOINT_COMMIT_FILE);
    if (remove(commit_file) != 0 && errno != ENOENT)
        fatal(EXIT_DATA, "cannot remove %s: %s", commit_file, strerror(errno));
    checkpoint_remove_tree(path);
}

void checkpoint_apply_retention(const char *run_dir, int keep_last, int keep_every)
{
    char checkpoints_dir[CHECKPOINT_PATH_MAX], path[CHECKPOINT_PATH_MAX];
    checkpoint_path_join(checkpoints_dir, sizeof checkpoints_dir, run_dir, CHECKPOINT_DIRECTORY);
    DIR *listing = opendir(checkpoints_dir);
    if (!listing)
        return; /* nothing saved yet */
    StepEntry *entries = NULL;
    int count = 0, capacity = 0;
    for (struct dirent *entry; (entry = readdir(listing)) != NULL;) {
        StepEntry step_entry = {0};
        if (strlen(entry->d_name) >= sizeof step_entry.name ||
            !checkpoint_parse_step_name(entry->d_name, &step_entry.step, &step_entry.is_tmp))
            continue;
        checkpoint_path_join(path, sizeof path, checkpoints_dir, entry->d_name);
        if (!checkpoint_is_directory(path))
            continue;
        strcpy(step_entry.name, entry->d_name);
        step_entry.committed = !step_entry.is_tmp && checkpoint_is_committed(path);
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            entries = xrealloc(entries, sizeof *entries * (size_t)capacity);
        }
        entries[count++] = step_entry;
    }
    closedir(listing);

    /* the checkpoint a resume would pick stays, whatever its step */
    char latest[CHECKPOINT_PATH_MAX] = "";
    const char *latest_name = "";
    if (checkpoint_find_latest_in(checkpoints_dir, latest, sizeof latest))
        latest_name = strrchr(latest, '/') + 1;

    qsort(entries, (size_t)count, sizeof *entries, step_entry_compare_newest_first);
    int committed_seen = 0;
    for (int i = 0; i < count; i++) {
        bool keep = false;
        if (entries[i].committed) {
            committed_seen++;
            keep = keep_last <= 0 || committed_seen <= keep_last ||
                   (keep_every > 0 && entries[i].step % keep_every == 0) ||
                   strcmp(entries[i].name, latest_name) == 0;
        }
        if (keep)
            continue;
        /* not kept: an older checkpoint, a stale step_X.tmp of a save that died, or a step
         * directory without COMMITTED left by a deletion that was interrupted */
        checkpoint_path_join(path, sizeof path, checkpoints_dir, entries[i].name);
        step_directory_delete(path);
    }
    free(entries);
    checkpoint_sync_path(checkpoints_dir);
}
