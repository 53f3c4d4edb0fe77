// Transmuter: run ONNX models on MLX. Umbrella header.
#pragma once

#include "transmuter/dtype.h"
#include "transmuter/error.h"
#include "transmuter/hub.h"  // hf:// sources (built in unless -DTRANSMUTER_HUB=OFF)
#include "transmuter/model.h"
#include "transmuter/operators.h"
#include "transmuter/runtime.h"
#include "transmuter/value.h"
#include "transmuter/value_info.h"
