/*
 GPU energy from NVML, loaded at run time (dlopen of the driver's
 libnvidia-ml.so.1), so the binaries neither link nor need it: the total
 energy counter (millijoules since the driver loaded, Volta and newer) of the
 device with a given PCI bus id. When the library, the symbols or the counter
 are missing, nvml_open says so and the caller reports energy as unavailable.
*/
#ifndef LLMC_NVML_H
#define LLMC_NVML_H

#include <dlfcn.h>
#include <stddef.h>

typedef struct {
    void* lib;
    void* device; // nvmlDevice_t
    int (*total_energy)(void* device, unsigned long long* millijoules);
} Nvml;

// 1 when the energy counter of the device at pci_bus_id (e.g. "0000:1B:00.0") can be read
static inline int nvml_open(Nvml* n, const char* pci_bus_id) {
    n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    n->device = NULL;
    n->total_energy = NULL;
    if (n->lib == NULL) { return 0; }
    int (*init)(void) = (int (*)(void))dlsym(n->lib, "nvmlInit_v2");
    int (*by_bus)(const char*, void**) = (int (*)(const char*, void**))dlsym(n->lib, "nvmlDeviceGetHandleByPciBusId_v2");
    n->total_energy = (int (*)(void*, unsigned long long*))dlsym(n->lib, "nvmlDeviceGetTotalEnergyConsumption");
    unsigned long long mj = 0;
    if (init == NULL || by_bus == NULL || n->total_energy == NULL || init() != 0 || by_bus(pci_bus_id, &n->device) != 0 ||
        n->total_energy(n->device, &mj) != 0) {
        dlclose(n->lib);
        n->lib = NULL;
        return 0;
    }
    return 1;
}

// the device's energy counter in joules (nvml_open must have returned 1)
static inline double nvml_energy_joules(const Nvml* n) {
    unsigned long long mj = 0;
    if (n->total_energy(n->device, &mj) != 0) { return -1.0; }
    return mj * 1e-3;
}

#endif // LLMC_NVML_H
