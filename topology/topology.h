// loom::topology, the public face: include this one header.
//
//   detect.h     detectLocal / detectWithEnvironment / overlayTopoFile / detectHostId
//   reader.h     Reader, DirReader (live or recorded tree), MapReader (tests)
//   gpu_source.h NVML (dlopen) and recorded GPU answers, P2P access through CUDA
//   gid_table.h  an RDMA port's GID table and the index NCCL would use
//   cuda_device.h cudaDeviceBusId: a CUDA device index's PCI bus id (libcuda, dlopen)
//   system.h     System: the machine as NCCL's XML describes it; mergeInto
//   xml.h        parseXml / readXmlFile / toXml / writeXmlFile
//   graph.h      Graph::build, paths (LOC..SYS), bandwidths, closest NIC per GPU
//   search.h     ClusterView, searchRings, searchTrees, doubleBinaryTree, hostShapeKey
//   report.h     toJson, graphToJson, formatMatrix
#pragma once

#include "topology/cuda_device.h"
#include "topology/detect.h"
#include "topology/gid_table.h"
#include "topology/gpu_source.h"
#include "topology/graph.h"
#include "topology/reader.h"
#include "topology/report.h"
#include "topology/search.h"
#include "topology/system.h"
#include "topology/xml.h"
