/* launch/solo_step.c — see solo_step.h. */
#include "launch/solo_step.h"

#include <stdlib.h>

void solo_step_create(SoloStep *solo, const Backend *backend, const Config *config,
                      bool sites_alone)
{
    solo->config = *config;
    Config *own = &solo->config;
    own->optim.ema_decay = 0;
    solo->model = model_create(backend, &own->model, &own->residual,
                               own->train.microbatch_size, own->train.seq_len);
    model_route_sites_alone(solo->model, sites_alone);
    model_init_params(solo->model, own->seed, own->model.init_std);
    run_state_create(&solo->state, solo->model, own);
    solo->optimizer = run_state_optimizer(&solo->state, solo->model, &own->optim);
    grid_create(&solo->grid, 1, 1);
    step_create(&solo->step, solo->model, own, &solo->grid, &solo->optimizer);
    solo->data = data_open_train(own);
}

void solo_step_destroy(SoloStep *solo)
{
    data_close(solo->data);
    step_destroy(&solo->step);
    grid_destroy(&solo->grid);
    free((void *)solo->optimizer.ranges);
    run_state_destroy(&solo->state, solo->model);
    model_destroy(solo->model);
}
