/* launch/probe.h — `fathom probe --checkpoint DIR [--weights ema|raw] [--data SPEC]
 *                   [--samples N] [--slices S] [--json OUT.json]` (DESIGN 6; issue: attention
 *                   over depth).
 *
 * Runs the checkpoint's model forward on one batch of N evaluation windows (file order) and
 * reports, for every routing site:
 *   - per head (and per stream, for MSAR), the depth weights averaged over the batch's tokens:
 *     one number per source, summing to 1;
 *   - the width-disagreement probe of the MHAR paper (attnres sites): split the site's query
 *     and keys into S equal slices of the width; each slice alone gives a softmax over the
 *     sources, the whole query gives the shared one; report the mean over tokens and slices of
 *     KL(slice softmax || shared softmax), beside the same number for a random query of the
 *     same norm (a fixed seed), so "the query's width disagrees more than chance" reads off
 *     directly.
 * A table goes to stdout; --json writes the same numbers as one JSON object.
 */
#ifndef FATHOM_LAUNCH_PROBE_H
#define FATHOM_LAUNCH_PROBE_H

int probe_main(int argc, char **argv);

#endif
