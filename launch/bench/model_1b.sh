# launch/bench/model_1b.sh — sourced by the GPU scripts of launch/bench: the 1B model of the
# performance table (the MHAR paper's: d 1280, 36 layers, 16/8 heads of 80, ffn 5120, vocab
# 128256, 1024 tokens a sequence; `fathom bench`'s step case has the same) as --set
# overrides of launch/configs/demo.yaml, in the array model_1b. The batch, the residual and
# the run's other keys are the caller's.
model_1b=(--set model.vocab_size=128256 --set model.d_model=1280 --set model.n_layers=36
          --set model.n_heads=16 --set model.n_kv_heads=8 --set model.head_dim=80
          --set model.ffn_dim=5120 --set train.seq_len=1024)
