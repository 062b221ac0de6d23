# RematTorch.cmake — what the build takes from the LibTorch it found.
#
# remat_torch_cxx_standard(<out-var>)
#   The C++ standard to build with: 17 where the found LibTorch's headers allow
#   it, 20 where they require it (LibTorch 2.14's c10 headers #error below
#   C++20). Decided by compiling a file that includes those headers, not by
#   version number, so a LibTorch that changes the rule is still handled.
#
# remat_precompile_torch_headers(<target>)
#   Precompiles the LibTorch headers remat uses for <target> (REMAT_PRECOMPILE_HEADERS).
#   A target with several sources gets its own precompiled header; the parsing of
#   torch/torch.h, most of a translation unit's compile time, is then done once.
#
# remat_reuse_torch_headers(<target> <from>)
#   <target> reuses <from>'s precompiled header, for one-file targets such as
#   tests, where a header of their own would not pay. GCC uses it only when the
#   options match, position independence included: neither target may set
#   POSITION_INDEPENDENT_CODE (executables get -fPIE, libraries -fPIC). A header
#   that does not match is not an error; the target is compiled without it.

include(CheckCXXSourceCompiles)

function(remat_torch_cxx_standard out_var)
  if(DEFINED CACHE{REMAT_TORCH_CXX_STANDARD})
    message(STATUS "remat: LibTorch ${Torch_VERSION} builds with C++${REMAT_TORCH_CXX_STANDARD}")
    set(${out_var} ${REMAT_TORCH_CXX_STANDARD} PARENT_SCOPE)
    return()
  endif()
  set(CMAKE_REQUIRED_INCLUDES ${TORCH_INCLUDE_DIRS})
  set(CMAKE_REQUIRED_FLAGS -std=c++17)
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_source_compiles("
#include <c10/macros/Macros.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>
int main() { return TORCH_VERSION_MAJOR > 0 ? 0 : 1; }" REMAT_TORCH_ACCEPTS_CXX17)
  if(REMAT_TORCH_ACCEPTS_CXX17)
    set(standard 17)
  else()
    set(standard 20)
  endif()
  set(REMAT_TORCH_CXX_STANDARD ${standard} CACHE STRING
    "C++ standard required by the found LibTorch (17 or 20; detected)")
  message(STATUS "remat: LibTorch ${Torch_VERSION} builds with C++${standard}")
  set(${out_var} ${standard} PARENT_SCOPE)
endfunction()

option(REMAT_PRECOMPILE_HEADERS "Precompile the LibTorch headers" ON)

set(REMAT_TORCH_PCH_HEADERS
  <torch/torch.h>
  <torch/csrc/autograd/autograd.h>
  <torch/csrc/autograd/engine.h>
  <torch/csrc/autograd/function.h>
  <torch/csrc/autograd/variable.h>)

function(remat_precompile_torch_headers target)
  if(REMAT_PRECOMPILE_HEADERS)
    target_precompile_headers(${target} PRIVATE ${REMAT_TORCH_PCH_HEADERS})
  endif()
endfunction()

function(remat_reuse_torch_headers target from)
  if(REMAT_PRECOMPILE_HEADERS)
    target_precompile_headers(${target} REUSE_FROM ${from})
  endif()
endfunction()
