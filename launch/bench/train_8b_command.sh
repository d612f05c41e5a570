# launch/bench/train_8b_command.sh — sourced by the 8B-width scripts of launch/bench: the one
# `fathom train` configuration they time and profile. d 4096, 32/8 heads, ffn 14336, vocab
# 128256 (launch/configs/marin8b_block_mhar.yaml), LAYERS layers in blocks of 2, 4 x 4096
# tokens a step (4 microbatches of 1), one GPU, no activation checkpointing, synthetic data,
# no checkpoint (not even the final one: tens of GB at this width) and no evaluation.
#   train_8b_command BINARY RUN_DIR LAYERS STEPS RESIDUAL
# sets the array train_8b (the command line); RESIDUAL: standard, mhar_delta (H 8),
# attnres_delta (H 1), mhar_replace (H 8) or msar_delta (m 4, kernels 1 2 4 8, H 8). An
# unknown residual returns 2.
train_8b_command() {
  local binary=$1 run_dir=$2 layers=$3 steps=$4 residual=$5 routing
  case $residual in
    standard) routing=(--set residual.mode=standard) ;;
    mhar_delta) routing=(--set residual.mode=attnres --set residual.heads=8 --set residual.form=delta) ;;
    attnres_delta) routing=(--set residual.mode=attnres --set residual.heads=1 --set residual.form=delta) ;;
    mhar_replace) routing=(--set residual.mode=attnres --set residual.heads=8 --set residual.form=replace) ;;
    msar_delta) routing=(--set residual.mode=msar --set residual.heads=8 --set residual.streams=4
                         --set "residual.stream_kernels=[1, 2, 4, 8]" --set residual.form=delta) ;;
    *) echo "unknown residual $residual (standard, mhar_delta, attnres_delta, mhar_replace," \
            "msar_delta)" >&2
       return 2 ;;
  esac
  train_8b=("$binary" train launch/configs/marin8b_block_mhar.yaml
    --set run_dir="$run_dir" --set device=cuda --set parallel.dp=1 --set parallel.pp=1
    --set parallel.virtual_stages=1 --set parallel.schedule=1f1b
    --set model.n_layers="$layers" --set residual.granularity=block
    --set residual.layers_per_block=2 "${routing[@]}"
    --set train.steps="$steps" --set train.seq_len=4096 --set train.microbatch_size=1
    --set train.global_batch_size=4 --set train.activation_checkpointing=none
    --set fsdp.reshard_after_forward=false --set optim.warmup_steps=1
    --set data.source=synthetic --set checkpoint.every=0 --set checkpoint.save_final=false
    --set eval.every=0 --set log.every=1)
}
