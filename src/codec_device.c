/* codec_device.c — the codec object's path for device buffers (being written). */
#include "device.h"
