// bsjit: block-sparse matmul and attention compiled at run time for each layout. Everything public.
#pragma once

#include "bsjit/attention.hpp"
#include "bsjit/attention_layouts.hpp"
#include "bsjit/attention_ops.hpp"
#include "bsjit/cache.hpp"
#include "bsjit/conv.hpp"
#include "bsjit/conv_layout.hpp"
#include "bsjit/deploy.hpp"
#include "bsjit/error.hpp"
#include "bsjit/layout.hpp"
#include "bsjit/matmul.hpp"
#include "bsjit/types.hpp"
