/* launch/bench.h — `fathom bench`: kernels and training steps timed on the machine at hand
 * (DESIGN 6), the fathom column of the table in docs/performance.md.
 *
 *   fathom bench [--cases layers,attention,route,msar,step,step8b,graft] [--repeat N]
 *                [--device auto|cpu|cuda] [--small] [--json OUT.jsonl]
 *   mpirun -np D fathom bench --cases comm [...]
 *
 * Cases, at the shapes launch/bench/peer.py gives PyTorch (same GPU, same run):
 *   layers     4 Llama-3-8B decoder layers (d 4096, 32/8 heads, hd 128, FFN 14336), forward +
 *              backward of B 1 x T 4096 through the model (a 256-token vocabulary keeps the
 *              head out of the time); TFLOP/s of the layers by the DESIGN 6 formula
 *   attention  causal GQA attention alone (B 1, T 4096, 32/8 heads, hd 128): forward, and
 *              forward + backward (3.5x the forward FLOPs)
 *   route      block-MHAR delta routing at the 8B graft: d 4096, H 8, 2 x 4096 tokens, 64
 *              sites reading N = 2..9 sources, forward + backward, two-phase as the model
 *              routes (model/route_block.h); GB/s of the traffic the ops are built to move
 *   msar       the same sites through MSAR (4 streams, kernels 1 2 4 8) a site at a time, as
 *              the model runs a site alone: each stream's convolutions inside its routing
 *              read (route_conv ops)
 *   step       one training step of the MHAR paper's 1B model (d 1280, L 36, 16/8 heads,
 *              FFN 5120, V 128256, 32 x 1024 tokens in 4 microbatches of 8) with AdamW, for
 *              the standard residual, MHAR and MSAR (block of 4 layers, H 8, m 4) in the
 *              replace form, and both in the delta form; tokens/s and the device memory it
 *              held at most
 *   step8b     the same at the 8B width (d 4096, 32/8 heads, FFN 14336, V 128256, 4 layers,
 *              4 x 4096 tokens in 4 microbatches of 1, blocks of 2 layers): standard, MHAR
 *              delta and MSAR delta
 *   graft      the routing of the 8B graft as the model runs it: a step of one 2 x 4096-token
 *              microbatch at the 8B width and depth (32 layers, blocks of 4: the route and msar
 *              sites) with MLPs 256 wide and a 4096 vocabulary, standard, MHAR delta and MSAR
 *              delta; a routed step less the standard one is the routing of a microbatch
 * More cases, not in the default list: route-1b (the Block MHAR routing of one microbatch of
 * that step alone: d 1280, 8 x 1024 tokens, 73 sites, replace form, two-phase), route-sites
 * and route-1b-sites (the same routing a site at a time, as before the two-phase ops),
 * step-MODE, step8b-MODE and graft-MODE (one mode of a step: standard, mhar, msar,
 * mhar-delta, msar-delta).
 * Under mpirun, one case alone: comm, FSDP's grouped all-gather (compute copy) and
 * reduce-scatter (fp32) of a unit over the world's ranks, placed and communicating as
 * `fathom train` would (NCCL with a GPU a rank): a decoder layer of the 1B step and of
 * Llama-3-8B, and the 8B embedding; the slowest rank's time and bus GB/s as nccl-tests
 * count them (launch/bench_comm.c; launch/bench/peer_comm.py times torch.distributed).
 * --small shrinks every shape (a smoke test that runs on the cpu in seconds). Times are
 * medians of --repeat runs after two warm-ups, between backend events. One line per result
 * goes to --json; the table is printed last.
 */
#ifndef FATHOM_LAUNCH_BENCH_H
#define FATHOM_LAUNCH_BENCH_H

int bench_main(int argc, char **argv);

#endif
