// `xdit info <folder>`: what a diffusers model folder holds.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace xdit {

// Prints the pipeline class, then for each component its class and library and, for components
// with safetensors weights, the stored dtypes with their parameter counts, the total parameter
// count and the bytes the weights take in their stored dtypes. Throws xdit::Error on a bad folder.
void print_model_info(const std::string& folder, std::ostream& out);

// "512", "84.1M", "3.9B": counts in thousands (K), millions (M), billions (B), trillions (T).
std::string human_count(int64_t n);
// "512 B", "1.5 KiB", "7.3 GiB".
std::string human_bytes(uint64_t n);

}  // namespace xdit
