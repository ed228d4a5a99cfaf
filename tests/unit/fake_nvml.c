// fake_nvml.c: a stand-in for NVML (libnvidia-ml.so.1) for test_gpu_metrics.cpp. It defines the entry points
// engine/train/gpu_metrics.cpp looks up with dlsym, with NVML's names, signatures and struct layouts, and answers
// with known values, so that the loader's dlopen, dlsym and calls through NVML's C ABI run without a GPU.
//
// Devices, by PCI bus id as CUDA spells it (compared ignoring case, as NVML does):
//   0000:3b:00.0  memory used 1234 MiB, SM clock 1980 MHz, memory clock 3201 MHz, power 512345 mW, utilisation
//                 87 % (memory 41 %), GPU temperature 55 C
//   0000:86:00.0  the same, but utilisation is NVML_ERROR_NOT_SUPPORTED, as on a MIG instance
//   any other     NVML_ERROR_NOT_FOUND
// As NVML does: device calls before nvmlInit_v2, or after the nvmlShutdown that balances it, answer
// NVML_ERROR_UNINITIALIZED; an unknown handle, clock or sensor answers NVML_ERROR_INVALID_ARGUMENT; the graphics and
// video clocks differ from the SM and memory ones, so a loader asking for the wrong clock reads a wrong value.
// fake_nvml_live_inits (not NVML's) is the number of nvmlInit_v2 calls not yet balanced by nvmlShutdown.
//
// Where nvml.h is installed (the CUDA toolkit or the driver's development package; FAKE_NVML_HAVE_NVML_H) the
// compiler holds these definitions to NVML's own declarations; elsewhere the declarations below are NVML's as its
// header gives them. Built a second time with FAKE_NVML_WITHOUT_TEMPERATURE, which leaves out
// nvmlDeviceGetTemperature (deprecated in NVML 13): a library that lacks an entry point the loader needs.
#include <stddef.h>
#include <strings.h>

#ifdef FAKE_NVML_HAVE_NVML_H
#include <nvml.h>
#else
typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;
typedef enum nvmlClockType_enum {
    NVML_CLOCK_GRAPHICS = 0,
    NVML_CLOCK_SM = 1,
    NVML_CLOCK_MEM = 2,
    NVML_CLOCK_VIDEO = 3
} nvmlClockType_t;
typedef enum nvmlTemperatureSensors_enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlMemory_st {
    unsigned long long total;  // bytes
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct nvmlUtilization_st {
    unsigned int gpu;  // percent
    unsigned int memory;
} nvmlUtilization_t;
#endif

#define FAKE_NVML_EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
    const char* pci_bus_id;
    int reports_utilization;
};

static struct nvmlDevice_st g_devices[] = {{"0000:3b:00.0", 1}, {"0000:86:00.0", 0}};
static const size_t kDeviceCount = sizeof g_devices / sizeof g_devices[0];
static int g_live_inits;

static const unsigned long long kMiB = 1ull << 20;

FAKE_NVML_EXPORT int fake_nvml_live_inits(void) { return g_live_inits; }

// NVML_SUCCESS for one of this library's handles while NVML is initialised, the error NVML gives otherwise.
static nvmlReturn_t check_device(nvmlDevice_t device) {
    if (g_live_inits == 0) return NVML_ERROR_UNINITIALIZED;
    for (size_t i = 0; i < kDeviceCount; ++i) {
        if (device == &g_devices[i]) return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

FAKE_NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) {
    ++g_live_inits;
    return NVML_SUCCESS;
}

FAKE_NVML_EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (g_live_inits == 0) return NVML_ERROR_UNINITIALIZED;
    --g_live_inits;
    return NVML_SUCCESS;
}

FAKE_NVML_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS:
            return "Success";
        case NVML_ERROR_UNINITIALIZED:
            return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT:
            return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED:
            return "Not Supported";
        case NVML_ERROR_NOT_FOUND:
            return "Not Found";
        default:
            return "Unknown Error";
    }
}

FAKE_NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device) {
    if (g_live_inits == 0) return NVML_ERROR_UNINITIALIZED;
    if (pciBusId == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (size_t i = 0; i < kDeviceCount; ++i) {
        if (strcasecmp(pciBusId, g_devices[i].pci_bus_id) == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

FAKE_NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
    const nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS) return rc;
    memory->total = 143771 * kMiB;
    memory->used = 1234 * kMiB;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

FAKE_NVML_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int* clock) {
    const nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS) return rc;
    switch (type) {
        case NVML_CLOCK_GRAPHICS:
            *clock = 1755;
            return NVML_SUCCESS;
        case NVML_CLOCK_SM:
            *clock = 1980;
            return NVML_SUCCESS;
        case NVML_CLOCK_MEM:
            *clock = 3201;
            return NVML_SUCCESS;
        case NVML_CLOCK_VIDEO:
            *clock = 1500;
            return NVML_SUCCESS;
        default:
            return NVML_ERROR_INVALID_ARGUMENT;
    }
}

FAKE_NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
    const nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS) return rc;
    *power = 512345;  // milliwatts
    return NVML_SUCCESS;
}

FAKE_NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
    const nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS) return rc;
    if (!device->reports_utilization) return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = 87;
    utilization->memory = 41;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_WITHOUT_TEMPERATURE
FAKE_NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                                       unsigned int* temp) {
    const nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS) return rc;
    if (sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 55;
    return NVML_SUCCESS;
}
#endif
