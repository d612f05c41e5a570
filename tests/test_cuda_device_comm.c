/* tests/test_cuda_device_comm.c — runtime/device_comm.h on the cuda backend (DESIGN 3,
 * "Communication"): NCCL through the CUDA module on one GPU, and the ranks that share it.
 *
 * One GPU gives NCCL a communicator of one rank (forced with FATHOM_DEVICE_COMM=nccl, since a
 * group of one otherwise only copies): its init, both collectives, the order of the
 * communication stream after the compute stream, and the deadline that aborts a work that
 * cannot end. Two ranks on the one GPU must choose host-staged and give the rank-order
 * results of comm.h; forced onto NCCL they must end with exit 5 from NCCL's init. Each test
 * SKIPs without a GPU. All but the first run tests/device_comm_probe.c, alone or under
 * mpirun; the first holds the op table's event_wait, which device_comm_work_wait is.
 */
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/backend_cuda_event.h"
#include "tests/device_comm_support.h"
#include "tests/gpu_support.h"

static const char *const results[4] = {"allgather_f32", "allgather_bf16",
                                       "reduce_scatter_f32", "reduce_scatter_bf16"};

/* a slow producer on another stream: the host function blocks that stream for 300 ms */
static void hold_the_stream(void *unused)
{
    (void)unused;
    usleep(300000);
}

Test(cuda_device_comm, event_wait_holds_the_compute_stream_until_another_streams_event,
     .timeout = 60)
{
    gpu_require();
    const Backend *cuda = backend_cuda();
    enum { COUNT = 1 << 20 };
    float *fresh = gpu_test_fp32_values(COUNT, 1, 71), *got = gpu_test_host_floats(COUNT);
    float *source = cuda->alloc(COUNT * sizeof(float));
    float *produced = cuda->alloc(COUNT * sizeof(float));
    float *consumed = cuda->alloc(COUNT * sizeof(float));
    cuda->upload(source, fresh, COUNT * sizeof(float));
    cuda->synchronize();
    cudaStream_t producer;
    BackendEvent done;
    cr_assert_eq(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaEventCreateWithFlags(&done.event, cudaEventDisableTiming), cudaSuccess);
    cr_assert_eq(cudaLaunchHostFunc(producer, hold_the_stream, NULL), cudaSuccess);
    cr_assert_eq(cudaMemcpyAsync(produced, source, COUNT * sizeof(float),
                                 cudaMemcpyDeviceToDevice, producer), cudaSuccess);
    cr_assert_eq(cudaEventRecord(done.event, producer), cudaSuccess);
    cuda->event_wait(&done);
    cuda->copy(consumed, produced, COUNT * sizeof(float)); /* after the producer's copy */
    cuda->download(got, consumed, COUNT * sizeof(float));
    cr_expect_eq(memcmp(got, fresh, COUNT * sizeof(float)), 0,
                 "the compute stream read the buffer before the other stream wrote it");
    cudaStreamSynchronize(producer);
    cudaEventDestroy(done.event);
    cudaStreamDestroy(producer);
    cuda->release(source);
    cuda->release(produced);
    cuda->release(consumed);
    free(fresh);
    free(got);
}

/* Rank `rank` printed `method` and four results equal to the references. */
static void expect_collectives(const char *output, int rank, const char *method)
{
    char value[256];
    cr_assert_not_null(device_probe_line(output, rank, "method", value, sizeof value), "%s",
                       output);
    cr_expect_str_eq(value, method, "rank %d: %s", rank, output);
    for (int k = 0; k < 4; k++) {
        cr_assert_not_null(device_probe_line(output, rank, results[k], value, sizeof value),
                           "%s", output);
        cr_expect_str_eq(value, "equal", "rank %d %s", rank, results[k]);
    }
}

static unsigned long long counter(const char *output, int rank, const char *name)
{
    char key[128], value[64];
    snprintf(key, sizeof key, "counter %s", name);
    cr_assert_not_null(device_probe_line(output, rank, key, value, sizeof value), "%s", output);
    return strtoull(value, NULL, 10);
}

Test(cuda_device_comm, a_one_rank_nccl_communicator_gathers_and_reduce_scatters_exactly,
     .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output();
    const int status = device_probe_run(0, "FATHOM_DEVICE_COMM=nccl", "collectives cuda",
                                        output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    expect_collectives(output, 0, "nccl");
    cr_expect_eq(counter(output, 0, "fsdp_allgather_bytes"), 0);
    cr_expect_eq(counter(output, 0, "fsdp_reducescatter_bytes"), 0);
    free(output);
}

Test(cuda_device_comm, a_group_of_one_copies_on_the_compute_stream, .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output(), value[256];
    const int status = device_probe_run(0, "", "collectives cuda", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    expect_collectives(output, 0, "nccl");
    cr_assert_not_null(device_probe_line(output, 0, "reason", value, sizeof value));
    cr_expect_str_eq(value, "1 rank: operations are copies");
    free(output);
}

Test(cuda_device_comm, nccl_reads_the_send_buffer_as_the_compute_stream_leaves_it,
     .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output(), value[256];
    const int status = device_probe_run(0, "FATHOM_DEVICE_COMM=nccl", "ordering cuda", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    cr_assert_not_null(device_probe_line(output, 0, "method", value, sizeof value), "%s",
                       output);
    cr_expect_str_eq(value, "nccl");
    cr_assert_not_null(device_probe_line(output, 0, "ordering", value, sizeof value), "%s",
                       output);
    cr_expect_str_eq(value, "wrong 0 stale 0");
    free(output);
}

Test(cuda_device_comm, an_nccl_work_past_the_deadline_is_aborted_with_exit_5,
     .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output();
    const int status = device_probe_run(0, "FATHOM_DEVICE_COMM=nccl", "deadline cuda", output);
    cr_assert_eq(status, 5, "exit %d: %s", status, output);
    cr_expect_not_null(strstr(output, "NCCL all-gather of 4.0 MiB on the group of world rank 0, "
                                      "as its rank 0, did not complete within "
                                      "parallel.timeout_s = 0.05 s"), "%s", output);
    cr_expect_not_null(strstr(output, "the NCCL communicator was aborted"), "%s", output);
    /* the abort releases the stream, so the probe may pass its synchronize and print
     * "deadline did not happen" in the moment before the watchdog ends the job: the exit
     * code and the message above are what show that the deadline fired */
    free(output);
}

Test(cuda_device_comm, two_ranks_on_one_gpu_stage_through_host_memory_exactly,
     .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output(), value[256];
    const int status = device_probe_run(2, "", "collectives cuda", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    for (int rank = 0; rank < 2; rank++) {
        expect_collectives(output, rank, "host-staged");
        cr_assert_not_null(device_probe_line(output, rank, "reason", value, sizeof value));
        cr_expect_eq(strncmp(value, "ranks 0 and 1 share GPU ", 24), 0, "%s", value);
        cr_expect_eq(counter(output, rank, "fsdp_allgather_bytes"), 1000 * 4 + 333 * 2);
        cr_expect_eq(counter(output, rank, "fsdp_reducescatter_bytes"), 500 * 4 + 250 * 2);
    }
    free(output);
}

/* ---- timing (device_comm.h) ---- */

Test(cuda_device_comm, nccl_timing_reads_the_communication_stream_and_sees_a_hidden_gather,
     .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output();
    const int status = device_probe_run(0, "FATHOM_DEVICE_COMM=nccl", "timing cuda", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    static const char *const kinds[4] = {"fsdp_allgather", "fsdp_reducescatter", "pp_send",
                                         "pp_recv"};
    for (int k = 0; k < 4; k++) {
        /* waited for at once: the compute stream stood still for about all of it */
        const DeviceProbeTime late = device_probe_time(output, 0, "late", kinds[k]);
        cr_expect_eq(late.operations, 1, "%s: %d operations", kinds[k], late.operations);
        cr_expect_gt(late.busy_ms, 0, "%s", kinds[k]);
        cr_expect_leq(late.exposed_ms, late.busy_ms + 0.05, "%s: exposed %.4f, busy %.4f",
                      kinds[k], late.exposed_ms, late.busy_ms);
        cr_expect_eq(device_probe_time(output, 0, "again", kinds[k]).operations, 0);
        cr_expect_eq(device_probe_time(output, 0, "off", kinds[k]).operations, 0);
    }
    /* started before four large matmuls and waited for after them: it ran beside them, and
     * the wait found it ended (its busy counts none of the matmuls it did not wait for) */
    const DeviceProbeTime hidden = device_probe_time(output, 0, "hidden", "fsdp_allgather");
    cr_expect_eq(hidden.operations, 1);
    cr_expect_gt(hidden.busy_ms, 0);
    cr_expect_lt(hidden.exposed_ms, 1.0, "a hidden gather exposed %.4f ms", hidden.exposed_ms);
    free(output);
}

Test(cuda_device_comm, host_staged_timing_is_all_exposed_and_finds_the_late_rank,
     .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output();
    const int status = device_probe_run(2, "", "timing cuda", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    device_probe_expect_synchronous_times(output, 300);
    free(output);
}

Test(cuda_device_comm, two_ranks_forced_onto_nccl_on_one_gpu_end_with_exit_5_from_init,
     .timeout = 90)
{
    gpu_require();
    char *output = device_probe_output();
    const int status = device_probe_run(2, "FATHOM_DEVICE_COMM=nccl", "collectives cuda",
                                        output);
    cr_assert_eq(status, 5, "exit %d: %s", status, output);
    cr_expect_not_null(strstr(output, "NCCL communicator init on the group of world ranks 0, 1"),
                       "%s", output);
    free(output);
}

/* ---- point to point: the pipeline's hops ------------------------------------------- */

/* Every message intact and in order although the compute stream was busy at each send and
 * the send buffer was overwritten right after it; bytes booked; where held buffers live. */
static void expect_cuda_hops(int ranks, const char *environment, const char *method,
                             const char *held_in)
{
    char *output = device_probe_output(), value[256];
    const int status = device_probe_run(ranks, environment, "hops cuda", output);
    cr_assert_eq(status, 0, "exit %d: %s", status, output);
    const unsigned long long bytes = (1000 + 257 + (1 << 16) + 1000 + 3) * 4ull;
    for (int rank = 0; rank < (ranks ? ranks : 1); rank++) {
        cr_assert_not_null(device_probe_line(output, rank, "method", value, sizeof value),
                           "%s", output);
        cr_expect_str_eq(value, method, "rank %d", rank);
        cr_assert_not_null(device_probe_line(output, rank, "hops wrong", value, sizeof value),
                           "%s", output);
        cr_expect_str_eq(value, "0", "rank %d: %s", rank, output);
        cr_expect_eq(counter(output, rank, "pp_send_bytes"), bytes, "rank %d", rank);
        cr_expect_eq(counter(output, rank, "pp_recv_bytes"), bytes, "rank %d", rank);
        cr_assert_not_null(device_probe_line(output, rank, "held", value, sizeof value));
        cr_expect(strstr(value, held_in) != NULL, "rank %d holds %s", rank, value);
    }
    free(output);
}

Test(cuda_device_comm, hops_to_itself_are_copies_on_the_compute_stream, .timeout = 90)
{
    gpu_require();
    expect_cuda_hops(0, "", "nccl", "backend memory");
}

Test(cuda_device_comm, hops_through_a_one_rank_nccl_communicator_are_exact, .timeout = 90)
{
    gpu_require();
    expect_cuda_hops(0, "FATHOM_DEVICE_COMM=nccl", "nccl", "backend memory");
}

Test(cuda_device_comm, hops_between_two_ranks_on_one_gpu_stage_through_host_memory,
     .timeout = 90)
{
    gpu_require();
    expect_cuda_hops(2, "", "host-staged", "host memory");
}
