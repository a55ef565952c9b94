#include "schemas/pool_descriptor.h"

namespace kvrelay::messages {

void set_shape(schema::PoolDescriptor::Builder d, const PoolGeometry& g) {
  d.setNumLayers(g.num_layers);
  d.setExtraLayers(g.extra_layers);
  d.setNumBlocks(g.num_blocks);
  d.setExtraLayerBlocks(g.extra_layer_blocks);
  d.setKvHeads(g.kv_heads);
  d.setBlockSize(g.block_size);
  d.setHeadDim(g.head_dim);
  d.setDtype(static_cast<schema::CacheDtype>(g.dtype));
  d.setHasScales(g.has_scales != 0);
  d.setHasValues(g.k_only == 0);
}

PoolGeometry shape_of(schema::PoolDescriptor::Reader d) {
  PoolGeometry g;
  g.num_layers = d.getNumLayers();
  g.extra_layers = d.getExtraLayers();
  g.num_blocks = d.getNumBlocks();
  g.extra_layer_blocks = d.getExtraLayerBlocks();
  g.kv_heads = d.getKvHeads();
  g.block_size = d.getBlockSize();
  g.head_dim = d.getHeadDim();
  g.dtype = static_cast<uint32_t>(d.getDtype());
  g.has_scales = d.getHasScales() ? 1 : 0;
  g.k_only = d.getHasValues() ? 0 : 1;
  return g;
}

}  // namespace kvrelay::messages
