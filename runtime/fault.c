/* runtime/fault.c — see fault.h. */
#include "runtime/fault.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

static FaultKind fault_kind = FAULT_NONE;
static int fault_step = -1;
static bool fault_in_save; /* during=save */
static bool fault_in_hop;  /* during=hop */
static int fault_current_step = -1;

static void fault_malformed(const char *text, const char *why)
{
    fatal(EXIT_CONFIG, "FATHOM_FAULT='%s': %s (expected rank=R,step=S,kind=nan|exit|stop)",
          text, why);
}

void fault_init(int world_rank)
{
    const char *text = getenv("FATHOM_FAULT");
    if (!text || !*text)
        return;
    char copy[256];
    if (strlen(text) >= sizeof copy)
        fault_malformed(text, "too long");
    strcpy(copy, text);
    int rank = -1, step = -1;
    FaultKind kind = FAULT_NONE;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *value = strchr(item, '=');
        if (!value)
            fault_malformed(text, "an item without '='");
        *value++ = '\0';
        char *end;
        if (!strcmp(item, "rank") || !strcmp(item, "step")) {
            long number = strtol(value, &end, 10);
            if (*value == '\0' || *end != '\0' || number < (*item == 'r' ? 0 : 1) ||
                number > 1000000000)
                fault_malformed(text, "rank and step take non-negative and positive integers");
            *(*item == 'r' ? &rank : &step) = (int)number;
        } else if (!strcmp(item, "during")) {
            if (!strcmp(value, "save"))
                fault_in_save = true;
            else if (!strcmp(value, "hop"))
                fault_in_hop = true;
            else
                fault_malformed(text, "during takes save or hop");
        } else if (!strcmp(item, "kind")) {
            kind = !strcmp(value, "nan") ? FAULT_NAN : !strcmp(value, "exit") ? FAULT_EXIT
                   : !strcmp(value, "stop") ? FAULT_STOP : FAULT_NONE;
            if (kind == FAULT_NONE)
                fault_malformed(text, "kind is nan, exit or stop");
        } else {
            fault_malformed(text, "unknown key");
        }
    }
    if (rank < 0 || step < 1 || kind == FAULT_NONE)
        fault_malformed(text, "rank, step and kind are all required");
    if ((fault_in_save || fault_in_hop) && kind == FAULT_NAN)
        fault_malformed(text, "during=save and during=hop take kind exit or stop");
    if (rank == world_rank) {
        fault_kind = kind;
        fault_step = step;
    }
}

static void fault_act(void)
{
    fflush(stdout);
    fflush(stderr);
    if (fault_kind == FAULT_EXIT)
        raise(SIGKILL);
    if (fault_kind == FAULT_STOP)
        raise(SIGSTOP); /* a SIGCONT lets it go on as if nothing happened */
}

void fault_save_progress(int step, int done, int total)
{
    if (fault_in_save && fault_kind != FAULT_NONE && step == fault_step && 2 * done >= total) {
        fault_act();
        fault_kind = FAULT_NONE; /* once */
    }
}

void fault_step_begin(int step)
{
    fault_current_step = step;
}

void fault_hop_send(void)
{
    if (fault_in_hop && fault_kind != FAULT_NONE && fault_current_step == fault_step) {
        fault_act();
        fault_kind = FAULT_NONE; /* once */
    }
}

FaultKind fault_at(int step)
{
    if (fault_kind == FAULT_NONE || step != fault_step || fault_in_save || fault_in_hop)
        return FAULT_NONE;
    fault_act();
    return fault_kind == FAULT_NAN ? FAULT_NAN : FAULT_NONE;
}
