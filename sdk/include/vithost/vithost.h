/* vithost.h - everything a plugin author includes. */
#ifndef VITHOST_VITHOST_H
#define VITHOST_VITHOST_H

#include "vh_comm.h"
#include "vh_config.h"
#include "vh_data.h"
#include "vh_data_pass.h"
#include "vh_device.h"
#include "vh_host.h"
#include "vh_loss_scaler.h"
#include "vh_mix.h"
#include "vh_model.h"
#include "vh_optim.h"
#include "vh_optim_schedule.h"
#include "vh_params.h"
#include "vh_plugin.h"
#include "vh_precision.h"
#include "vh_prefetch.h"
#include "vh_rand_augment.h"
#include "vh_random.h"
#include "vh_sampler.h"
#include "vh_sharding.h"
#include "vh_status.h"
#include "vh_types.h"

#endif
