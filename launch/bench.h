/* launch/bench.h — `fathom bench`: kernels and training steps timed on the machine at hand
 * (DESIGN 6), the fathom column of the table in docs/performance.md.
 *
 *   fathom bench [--cases layers,attention,route,msar,step] [--repeat N]
 *                [--device auto|cpu|cuda] [--small] [--json OUT.jsonl]
 *
 * Cases, at the shapes launch/bench/peer.py gives PyTorch (same GPU, same run):
 *   layers     4 Llama-3-8B decoder layers (d 4096, 32/8 heads, hd 128, FFN 14336), forward +
 *              backward of B 1 x T 4096 through the model (a 256-token vocabulary keeps the
 *              head out of the time); TFLOP/s of the layers by the DESIGN 6 formula
 *   attention  causal GQA attention alone (B 1, T 4096, 32/8 heads, hd 128): forward, and
 *              forward + backward (3.5x the forward FLOPs)
 *   route      block-MHAR delta routing at the 8B graft: d 4096, H 8, 2 x 4096 tokens, 64
 *              sites reading N = 2..9 sources, forward + backward; GB/s of the ideal traffic
 *   msar       the same sites through MSAR (4 streams, kernels 1 2 4 8), as the model runs it:
 *              each stream's convolutions inside its routing read (route_conv ops)
 *   step       one training step of the MHAR paper's 1B model (d 1280, L 36, 16/8 heads,
 *              FFN 5120, V 128256, 32 x 1024 tokens in 4 microbatches of 8) with AdamW, for
 *              the standard residual, MHAR (block of 4 layers, H 8) and MSAR (m 4); tokens/s
 *              and the device memory it held at most
 * More cases, not in the default list: route-1b (the Block MHAR routing of one microbatch of
 * that step alone: d 1280, 8 x 1024 tokens, 73 sites, replace form), and step-standard,
 * step-mhar, step-msar (one mode of the step).
 * --small shrinks every shape (a smoke test that runs on the cpu in seconds). Times are
 * medians of --repeat runs after two warm-ups, between backend events. One line per result
 * goes to --json; the table is printed last.
 */
#ifndef FATHOM_LAUNCH_BENCH_H
#define FATHOM_LAUNCH_BENCH_H

int bench_main(int argc, char **argv);

#endif
